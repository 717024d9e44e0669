"""Defaults in one place (all configurable through the public constructors)."""

CHUNK_SIZE = 65536  # target characters per chunk of a stateless text
CUT_THRESHOLD = 131072  # texts shorter than this are never cut
MAX_CHUNKS = 16
MIN_CUT_TEXT = 256  # never cut a text shorter than this
SCAN_NEAR = 48  # characters scanned backward from a tentative cut first
SCAN_FAR = 4096  # then up to this many
MIN_CHUNK_FLOOR = 16
MIN_CHUNK_CAP = 1024

REPAIR_WINDOW = 512  # first search window for a session's tail checkpoint
REPAIR_DOUBLINGS = 5  # the window doubles at most this many times
MIN_MARGIN = 8  # a session cut stays at least max(8, longest added token) before the stored end
MAX_CHECKPOINTS = 1024
CHECKPOINT_EVERY = 16384  # a session span this long gets intermediate checkpoints
MAX_CHECKPOINT_PIECES = 64

MAX_SESSION_BYTES = 128 * 1024 * 1024  # resident session text and IDs
MAX_SESSIONS = 4096

BATCH_BYTES = 8 << 20  # text per batch encode in the batch pipelines (bounds Python strings and buffers)
MAX_RECORD_BYTES = 64 << 20  # longest line of a text/JSONL input the batch reader holds (a longer one is refused)
# A JSONL line is checked by a bytes-level scan (_core/json_scan.py) before pyarrow's reader parses
# it: pyarrow's parser recurses per level (about 15,000 levels overflowed its stack: SIGSEGV), and
# its memory grows with the items (about 30 bytes each) and much faster with distinct keys (a
# column each: about 3 KB for one row). A line past any of these is refused naming its offset.
MAX_JSON_DEPTH = 64  # arrays and objects nested in one JSONL record (clamped count, carried across lines)
MAX_JSON_ITEMS = 1 << 20  # values and keys on one JSONL line (",:[{" outside strings, plus one)
MAX_JSON_KEYS = 1 << 16  # object keys on one JSONL line (":" outside strings)

KEYLESS_CANDIDATES = 8  # keyless conversations held per head and tenant: agents share system prompts

# The Ray pool.
LOCAL_MAX_BYTES = 4096  # stateless texts under this many UTF-8 bytes are encoded in the caller
REQUEST_TIMEOUT_S = 60.0  # no answer this long after first dispatch: encode in-process instead
STARTUP_TIMEOUT_S = 300.0
WORKER_CPUS = 0.5  # Ray CPU reservation of a worker actor (see actors/pool.py: no starvation)
TASK_CPUS = 0.0  # and of a chunk task: the dispatcher's in-flight limit bounds chunks (see actors/pool.py)
TASK_NICE = 10  # niceness of chunk-task processes: session repairs on the same cores go first
NAMESPACE = "delta_ray"
KNOWN_SESSIONS = 100_000  # sessions the pool remembers as initialized on some worker
MIRROR_BYTES = 256 * 1024 * 1024  # session IDs the pool keeps to splice workers delta answers
FAST_CHARS_PER_MS = 100_000.0  # a fast engine's speed before the pool measures its own (100 MB/s)
TEXT_MIRROR_BYTES = 256 * 1024 * 1024  # session texts the pool keeps so a whole-transcript turn ships only its suffix
SHADOW_RATE = 0.01  # share of fast-tier answers re-checked with the reference, off the request path
POOL_SHADOW_RATE = SHADOW_RATE  # the same knob in the pool and Serve
SESSION_LOCK_STRIPES = 64  # per-session locks of a DeltaTokenizer (concurrent calls on one session serialize)
ENGINES = ("auto", "reference", "fast")  # TokenizerConfig.engine: admitted fast tier if any, or one of the two
