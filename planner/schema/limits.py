"""The physical bounds of the specs' figures as plain numbers (planner/schema/bounds.py builds
the field types on them): no pydantic, so that the command line can name them in its help.
"""

# Physical bounds: every figure is finite (no inf or nan anywhere: Spec's allow_inf_nan) and at
# most these, far past any machine or model built or announced, so that no arithmetic of the
# cost model overflows and a typo (1e30 tokens per sequence) is refused naming its field.
MAX_COUNT = 2**20  # layers, heads, devices per node, NICs per node, ... (1,048,576)
MAX_WIDTH = 2**22  # hidden, ffn_hidden, vocabulary (4,194,304)
MAX_SEQ_LEN = 2**26  # tokens per sequence (67,108,864)
MAX_BATCH = 2**30  # sequences per optimizer step
MAX_NODES = 2**24  # nodes of one system (16,777,216)
MAX_TOKENS = 1e18  # token budget
MAX_RATE = 1e9  # TFLOP/s per device, GB/s, Gbit/s per NIC (a million times today's)
MAX_SIZE_GIB = 2.0**30  # GiB per device (an exbibyte)
MAX_TIME = 1e9  # latencies (us), overheads (us or s)
MAX_NAME = 256  # characters of a name
MAX_TEXT = 8192  # characters of a description
