"""The protein vocabulary shared by the planner (vocab size) and the runtime (tokeniser).

Tokens: special tokens first, then the 20 standard amino acids, then the IUPAC ambiguous or
rare letters (B = D/N, Z = E/Q, J = I/L, X = any, U = selenocysteine, O = pyrrolysine).
"""

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<mask>", "<unk>")
STANDARD_AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
AMBIGUOUS_AMINO_ACIDS = "BZJXUO"

TOKENS = SPECIAL_TOKENS + tuple(STANDARD_AMINO_ACIDS) + tuple(AMBIGUOUS_AMINO_ACIDS)
TOKEN_TO_ID = {tok: i for i, tok in enumerate(TOKENS)}
PAD_ID, BOS_ID, EOS_ID, MASK_ID, UNK_ID = range(len(SPECIAL_TOKENS))
VOCAB_SIZE = len(TOKENS)  # 31
