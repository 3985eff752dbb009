"""FASTA in blocks: the fast reader behind `prepare` (runtime/dataprep/prepare.py).

A file is read in blocks of about BLOCK_BYTES that end where a record starts (a line
beginning with '>'), so that each block is parsed on its own, in this process or in a worker
(`--workers`). A block is parsed with bytes-level operations over the whole buffer and numpy
over the positions of its lines, never per residue in Python:

    headers     lines whose first byte is '>' (numpy over the newline positions)
    bodies      joined by one bytes.join with <eos><bos> markers between them, and
                translated to token ids with whitespace and '*' deleted, in one
                bytes.translate (any other byte becomes 255)
    records     <bos> positions in the translation bound each record; its id is its
                header's first word; its split is split_of(id) (one blake2b each)

A record that is not plainly kept (an id-less header, a comment line, a byte outside the
alphabet, a '*' that is not its last residue, no residues or more than max_len, a raw
control byte that would read as a marker) is parsed again by the reference line parser
(runtime/dataprep/fasta.py LineParser), so every record, kept or skipped, and every count,
is what reading the file line by line gives (tests/runtime/test_data.py compares both on
edge cases and random files). A record with no record boundary within LONG_BYTES is read line by
line as it streams, in memory bounded by max_len, as the reference reader does.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from dataclasses import dataclass, field

import numpy as np

from planner.schema.vocab import BOS_ID, EOS_ID, TOKEN_TO_ID
from runtime.dataprep.fasta import (_ALPHABET_BOTH, _TABLE, _WHITESPACE, SKIP_REASONS, FastaRecord, LineParser,
                                    record_id)

BLOCK_BYTES = 8 << 20       # about this much FASTA per block
LONG_BYTES = 8 * BLOCK_BYTES  # a record this long without a boundary is streamed line by line
_RAW_BOS, _RAW_EOS = 1, 2     # marker bytes in the joined bodies (a body holding them is parsed again)
_BAD = 255
# Letters -> token ids, markers -> <bos>/<eos>, everything else -> 255; whitespace and '*'
# are deleted by the same translate.
_FAST = bytearray([_BAD]) * 256
for _c in _ALPHABET_BOTH:
    _FAST[_c] = _TABLE[_c]
_FAST[_RAW_BOS], _FAST[_RAW_EOS] = BOS_ID, EOS_ID
_FAST = bytes(_FAST)
_DELETE = _WHITESPACE + b"*"
_SEP = bytes([_RAW_EOS, _RAW_BOS])
_NUCLEOTIDES = bytes(TOKEN_TO_ID[c] for c in "ACGTUN")
_IS_NUCLEOTIDE = bytes(1 if i in _NUCLEOTIDES else 0 for i in range(256))  # token id -> 1 for A C G T U N
READ_ERRORS = (EOFError, zlib.error, OSError)  # gzip.BadGzipFile is an OSError


@dataclass
class SplitPart:
    """One split's records of a block: their tokens back to back, and each one's length."""

    tokens: bytes = b""
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


@dataclass
class BlockResult:
    lines: int                               # newlines in the block
    splits: dict[str, SplitPart]
    kept: int = 0
    residues: int = 0
    nucleotides: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: list[tuple[int, str, str, str]] = field(default_factory=list)  # line in block, id, reason, detail
    seen_header: bool = False


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse (a trim threshold of 256 MiB, buffers
    up to 32 MiB from the heap) rather than return it to the system after every block: each
    block's buffers are fresh allocations of MBs, and faulting their pages in again cost a
    third of the CPU time. Process-wide, so `exaplan data prepare` sets it and the library
    does not. False where there is no glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_trim_threshold, 256 << 20)) and bool(libc.mallopt(m_mmap_threshold, 32 << 20))
    except (OSError, AttributeError):
        return False


def split_threshold(val_fraction: float) -> int | None:
    """The integer bound b with hash < b exactly when hash < val_fraction x 2**64 (split_of's
    rule, for integer hashes); None when nothing goes to val."""
    if val_fraction <= 0:
        return None
    return math.ceil(val_fraction * 2.0**64)


def _split_names(ids: list[bytes], seed: int, bound: int | None) -> np.ndarray:
    """Per id, True for val: blake2b-64 of seed NUL id, as split_of hashes the decoded id."""
    if bound is None or not ids:
        return np.zeros(len(ids), dtype=bool)
    base = hashlib.blake2b(f"{seed}\0".encode(), digest_size=8)
    digests = []
    for i in ids:
        h = base.copy()
        h.update(i if i.isascii() else i.decode("utf-8", "replace").encode("utf-8", "surrogatepass"))
        digests.append(h.digest())
    digests = np.frombuffer(b"".join(digests), dtype="<u8")
    return digests < np.uint64(bound) if bound < 2**64 else np.ones(len(ids), dtype=bool)


def _scatter(values: np.ndarray, at: np.ndarray, n: int) -> np.ndarray:
    """A boolean array of n, True where `at[i]` has values[i] True."""
    out = np.zeros(n, dtype=bool)
    out[at[values]] = True
    return out


def _slow_records(buf: bytes, a: np.ndarray, starts: np.ndarray, heads: np.ndarray, head_end: np.ndarray,
                  body: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per record, True where the plain path cannot take it: comment lines, id-less headers,
    raw marker bytes, more than one '*' or one that is not the last residue."""
    n, r = len(a), len(heads)
    slow = np.zeros(r, dtype=bool)
    comments = starts[a[starts] == 59]  # ';'
    if len(comments):
        slow[np.searchsorted(heads, comments, side="right") - 1] = True
    after = np.minimum(heads + 1, n - 1)
    slow |= (heads + 1 >= head_end) | np.isin(a[after], np.frombuffer(_WHITESPACE, np.uint8))
    for marker in (_RAW_BOS, _RAW_EOS):
        if buf.find(bytes([marker])) >= 0:
            slow[np.searchsorted(heads, np.flatnonzero(a == marker), side="right") - 1] = True
    if buf.find(b"*") >= 0:
        stars = np.flatnonzero(a == 42)
        rec = np.searchsorted(heads, stars, side="right") - 1
        in_body = (rec >= 0) & (stars >= body[np.maximum(rec, 0)])
        stars, rec = stars[in_body], rec[in_body]
        many = np.flatnonzero(np.bincount(rec, minlength=r) > 1)
        slow[many] = True
        for p, k in zip(stars.tolist(), rec.tolist()):  # one star: kept only as the last residue
            if buf[p + 1:int(ends[k])].translate(None, _WHITESPACE):
                slow[k] = True
    return slow


def _translate(buf: bytes, body: np.ndarray, ends: np.ndarray, slow: np.ndarray):
    """The bodies of the records not marked slow, joined with <eos><bos> between them and
    translated to token ids: (the translation, its tokens between the outer markers as a
    memoryview, those tokens as numpy, each record's <bos> position, each one's end)."""
    mv = memoryview(buf)
    # <eos><bos> between the bodies and around them; the first <eos> and the last <bos> are cut off.
    joined = _SEP.join([b""] + [b"" if s else mv[b0:b1]
                                for b0, b1, s in zip(body.tolist(), ends.tolist(), slow.tolist())] + [b""])
    translated = joined.translate(_FAST, _DELETE)
    del joined
    tokens = memoryview(translated)[1:-1]
    t = np.frombuffer(tokens, dtype=np.uint8)
    bos = np.flatnonzero(t == BOS_ID)
    if len(bos) != len(body):  # cannot happen: every body holding a marker byte was left out
        raise AssertionError(f"{len(bos)} records marked, {len(body)} headers")
    return translated, tokens, t, bos, np.append(bos[1:], len(t))


def _reparse(buf: bytes, path: str, max_len: int, heads: list[int], ends: list[int], line_of_head: np.ndarray,
             slow_idx: np.ndarray, out: BlockResult) -> dict[int, FastaRecord]:
    """The slow records parsed by the reference line parser; skips counted into `out`."""
    records: dict[int, FastaRecord] = {}
    for k in slow_idx.tolist():
        parser = LineParser(path, max_len, int(line_of_head[k]), True)
        for line in buf[heads[k]:ends[k]].splitlines(keepends=True):
            parser.line(line)
        rec = parser.end_record()
        records[k] = rec
        if rec.skip is not None:
            out.skipped[rec.skip] += 1
            if len(out.examples) < 20:
                out.examples.append((rec.line, rec.id, rec.skip, rec.detail))
    return records


def _fill_splits(out: BlockResult, tokens: memoryview, bos: np.ndarray, seg_end: np.ndarray, slow: np.ndarray,
                 fast: np.ndarray, val: np.ndarray, records: dict[int, FastaRecord], kept_slow: list[int],
                 seed: int, bound: int | None) -> None:
    """Each split's tokens and lengths, in file order."""
    r = len(slow)
    bos_l, seg_end_l = bos.tolist(), seg_end.tolist()
    if not kept_slow:
        for name, pick in (("train", ~slow & ~_scatter(val, fast, r)), ("val", _scatter(val, fast, r))):
            # runs of consecutive records of the split are one slice each
            edges = np.flatnonzero(np.diff(np.concatenate(([False], pick, [False])).view(np.int8)))
            first, last = edges[0::2].tolist(), (edges[1::2] - 1).tolist()
            out.splits[name] = SplitPart(b"".join([tokens[bos_l[i]:seg_end_l[j]] for i, j in zip(first, last)]),
                                         (seg_end[pick] - bos[pick]).astype(np.int64))
        return
    # records parsed again among the kept ones
    val_of = dict(zip(fast.tolist(), val.tolist()))
    for k in kept_slow:
        val_of[k] = _split_names([records[k].id.encode("utf-8", "surrogatepass")], seed, bound)[0]
    for name, want in (("train", False), ("val", True)):
        idx = sorted(k for k, v in val_of.items() if bool(v) == want)
        pieces = [records[k].tokens if k in records else tokens[bos_l[k]:seg_end_l[k]] for k in idx]
        out.splits[name] = SplitPart(b"".join(pieces), np.array([len(p) for p in pieces], dtype=np.int64))


def parse_block(buf: bytes, path: str, max_len: int, seed: int, bound: int | None, at_start: bool) -> BlockResult:
    """Parse one block: the start of the file (`at_start`), or from a header line on. Line
    numbers (of the examples) count from the block's first line; PlanError (sequence data
    before the first header) as the reference parser raises it."""
    a = np.frombuffer(buf, dtype=np.uint8)
    n = len(a)
    nl = np.flatnonzero(a == 10)
    starts = np.concatenate(([0], nl + 1))
    starts = starts[starts < n]
    heads = starts[a[starts] == 62]  # '>'
    out = BlockResult(lines=len(nl), splits={"train": SplitPart(), "val": SplitPart()},
                      skipped={r: 0 for r in SKIP_REASONS})
    # What comes before the first header (only ever at the start of a file): the reference parser.
    pre_end = int(heads[0]) if len(heads) else n
    if pre_end:
        parser = LineParser(path, max_len, 0, not at_start)
        for line in buf[:pre_end].splitlines(keepends=True):
            parser.line(line)
        if not len(heads):
            out.seen_header = parser.seen_header
            return out
    out.seen_header = True
    r = len(heads)
    line_of_head = np.searchsorted(starts, heads)  # 0-based line index in the block
    ends = np.append(heads[1:], n)  # each record's end (the next header)
    head_end = nl[np.minimum(np.searchsorted(nl, heads), max(len(nl) - 1, 0))] if len(nl) else np.full(r, n)
    head_end = np.where(head_end > heads, head_end, n)  # no newline after the last header: the end
    body = np.minimum(head_end + 1, ends)
    slow = _slow_records(buf, a, starts, heads, head_end, body, ends)
    translated, tokens, t, bos, seg_end = _translate(buf, body, ends, slow)
    residues = seg_end - bos - 2
    bad = np.flatnonzero(t == _BAD)
    if len(bad):
        slow[np.searchsorted(bos, bad, side="right") - 1] = True
    slow |= (residues < 1) | (residues > max_len)
    fast = np.flatnonzero(~slow)
    heads_l, head_end_l = heads.tolist(), head_end.tolist()
    ids = [buf[heads_l[k] + 1:head_end_l[k]].split(None, 1)[0] for k in fast.tolist()]
    val = _split_names(ids, seed, bound)
    slow_idx = np.flatnonzero(slow)
    records = _reparse(buf, path, max_len, heads_l, ends.tolist(), line_of_head, slow_idx, out)
    kept_slow = [k for k, rec in records.items() if rec.tokens is not None]
    _fill_splits(out, tokens, bos, seg_end, slow, fast, val, records, kept_slow, seed, bound)
    out.kept = len(fast) + len(kept_slow)
    out.residues = int(residues[fast].sum()) + sum(records[k].residues for k in kept_slow)
    # nucleotide letters of the kept records: all the translation's, less the records parsed
    # again (their segments), plus those of them kept
    nuc = np.count_nonzero(np.frombuffer(translated.translate(_IS_NUCLEOTIDE), dtype=np.bool_))
    bos_l, seg_end_l = bos.tolist(), seg_end.tolist()
    for k in slow_idx.tolist():
        nuc -= np.count_nonzero(np.isin(t[bos_l[k]:seg_end_l[k]], np.frombuffer(_NUCLEOTIDES, np.uint8)))
    out.nucleotides = int(nuc) + sum(len(records[k].tokens) - len(records[k].tokens.translate(None, _NUCLEOTIDES))
                                     for k in kept_slow)
    return out


@dataclass
class Streamed:
    """A record read line by line (it had no record boundary within LONG_BYTES): the record
    (None: none ended here), the lines read, whether a header was seen."""

    record: FastaRecord | None
    lines: int
    seen_header: bool


class ReadFailed(Exception):
    """A read or decompression error, with the lines read but not yet handed out."""

    def __init__(self, err: BaseException, lines: int):
        super().__init__(str(err))
        self.err, self.lines = err, lines


def read_blocks(read, path: str, max_len: int):
    """Blocks of the stream `read(n)` gives (bytes, and whether it is the file's start, for
    parse_block) in order, with a Streamed item in place of each record too long for a block.
    ReadFailed on a read error."""
    carry, at_start, seen = b"", True, False
    while True:
        try:
            chunk = read(BLOCK_BYTES)
        except READ_ERRORS as err:
            raise ReadFailed(err, carry.count(b"\n")) from err
        if not chunk:
            if carry:
                yield carry, at_start
            return
        cut = chunk.rfind(b"\n>") + 1
        if cut == 0 and carry[-1:] == b"\n" and chunk[:1] == b">":
            cut = -1  # the chunk starts a record
        if cut:
            block, carry = (carry, chunk) if cut < 0 else (carry + chunk[:cut], chunk[cut:])
            if block:
                yield block, at_start
                at_start, seen = False, True
            continue
        carry += chunk
        if len(carry) > LONG_BYTES:
            item, carry = _stream_long(carry, read, path, max_len, seen or not at_start)
            seen = seen or item.seen_header
            at_start = False
            yield item


def _stream_long(pending: bytes, read, path: str, max_len: int, seen_header: bool) -> tuple[Streamed, bytes]:
    """Read one long record line by line, from `pending` on, up to the next header: (it,
    the bytes from that header on)."""
    parser = LineParser(path, max_len, 0, seen_header)
    while True:
        pos = 0
        while True:
            j = pending.find(b"\n", pos)
            if j < 0:
                break
            if pending[pos:pos + 1] == b">" and parser.header is not None:
                return Streamed(parser.end_record(), parser.lineno, parser.seen_header), pending[pos:]
            parser.line(pending[pos:j + 1])
            pos = j + 1
        pending = pending[pos:]
        try:
            chunk = read(BLOCK_BYTES)
        except READ_ERRORS as err:
            raise ReadFailed(err, parser.lineno) from err
        if not chunk:
            if pending[:1] == b">" and parser.header is not None:
                return Streamed(parser.end_record(), parser.lineno, parser.seen_header), pending
            if pending:
                parser.line(pending)
            return Streamed(parser.end_record(), parser.lineno, parser.seen_header), b""
        pending += chunk


__all__ = ["ReadFailed", "Streamed", "keep_freed_memory", "read_blocks", "BLOCK_BYTES", "BlockResult", "LONG_BYTES", "SplitPart", "parse_block", "record_id", "split_threshold"]
