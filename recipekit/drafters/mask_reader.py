"""Read mask_embedding.pt without unpickling: the torch zip is parsed and its pickle walked.

The pickle is never loaded. Its opcodes are read with pickletools.genops and interpreted
by a small machine that knows only what torch.save writes for one tensor, or for a dict
holding `embedding` and optionally `mask_token_id`. Any other global, opcode, key, entry,
compression, byte order or shape is refused before a single object is built from it.
"""

import pickletools
import zipfile
from dataclasses import dataclass

from .errors import Refused

# torch storage class -> (dtype name, bytes per element)
STORAGE_DTYPES = {
    "FloatStorage": ("float32", 4),
    "BFloat16Storage": ("bfloat16", 2),
    "HalfStorage": ("float16", 2),
}
REBUILD_TENSOR = ("torch._utils", "_rebuild_tensor_v2")
ORDERED_DICT = ("collections", "OrderedDict")
ALLOWED_GLOBALS = {REBUILD_TENSOR, ORDERED_DICT} | {("torch", name) for name in STORAGE_DTYPES}
ALLOWED_KEYS = {"embedding", "mask_token_id"}
# Records torch.save writes beside data.pkl and the tensor data; nothing else is accepted.
METADATA_RECORDS = {
    "byteorder",
    "version",
    ".format_version",
    ".storage_alignment",
    ".data/serialization_id",
    ".data/version",
}
MAX_PICKLE_BYTES = 64 * 1024  # a one-tensor pickle is a few hundred bytes

_GLOBALS_BOUND = (
    "only " + ", ".join(sorted(f"{m}.{n}" for m, n in ALLOWED_GLOBALS)) + " are allowed"
)
_CONVERT = "re-save only the embedding with torch.save({'embedding': t}) on a trusted machine"


@dataclass(frozen=True)
class MaskEmbedding:
    dtype: str  # float32, bfloat16 or float16
    data: bytes  # little-endian elements, exactly hidden_size of them
    mask_token_id: int | None  # the id the file states, if it states one


@dataclass(frozen=True)
class _Global:
    module: str
    name: str


@dataclass(frozen=True)
class _Storage:
    dtype: str
    itemsize: int
    key: str
    numel: int


@dataclass(frozen=True)
class _Tensor:
    storage: _Storage
    offset: int
    size: tuple
    stride: tuple


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


class _PickleWalk:
    """Interpret the allowed subset of pickle opcodes into plain values and tensor records."""

    def __init__(self, path):
        self.path = path
        self.stack = []
        self.marks = []
        self.memo = {}

    def refuse(self, field, value, bound):
        raise Refused(self.path, field, value, bound, _CONVERT)

    def pop_to_mark(self):
        if not self.marks:
            self.refuse("data.pkl", "MARK missing", "malformed pickle")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def pop(self):
        if not self.stack:
            self.refuse("data.pkl", "empty stack", "malformed pickle")
        return self.stack.pop()

    def global_(self, module, name):
        if (module, name) not in ALLOWED_GLOBALS:
            self.refuse("data.pkl global", f"{module}.{name}", _GLOBALS_BOUND)
        return _Global(module, name)

    def persistent(self, pid):
        ok = (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], _Global)
            and pid[1].module == "torch"
            and pid[1].name in STORAGE_DTYPES
            and isinstance(pid[2], str)
            and isinstance(pid[3], str)
            and _is_int(pid[4])
            and pid[4] >= 0
        )
        if not ok:
            self.refuse(
                "data.pkl persistent id",
                repr(pid),
                "must be ('storage', torch.<Float|BFloat16|Half>Storage, key, location, numel)",
            )
        dtype, itemsize = STORAGE_DTYPES[pid[1].name]
        return _Storage(dtype, itemsize, pid[2], pid[4])

    def reduce(self, function, args):
        if function == _Global(*ORDERED_DICT):
            if args != ():
                self.refuse(
                    "data.pkl OrderedDict arguments",
                    repr(args),
                    "only an empty OrderedDict() is allowed",
                )
            return {}
        if function == _Global(*REBUILD_TENSOR):
            if len(args) == 7 and args[6] is None:
                args = args[:6]
            ok = (
                len(args) == 6
                and isinstance(args[0], _Storage)
                and _is_int(args[1])
                and isinstance(args[2], tuple)
                and all(_is_int(d) for d in args[2])
                and isinstance(args[3], tuple)
                and all(_is_int(d) for d in args[3])
                and isinstance(args[4], bool)
                and args[5] == {}
            )
            if not ok:
                self.refuse(
                    "data.pkl tensor",
                    repr(args),
                    "must be a plain tensor without hooks or metadata",
                )
            return _Tensor(args[0], args[1], args[2], args[3])
        self.refuse(
            "data.pkl call",
            f"{getattr(function, 'module', '?')}.{getattr(function, 'name', repr(function))}",
            "only _rebuild_tensor_v2 and OrderedDict may be called",
        )

    def set_item(self, target, key, value):
        if not isinstance(target, dict):
            self.refuse("data.pkl", "SETITEM on a non-dict", "malformed pickle")
        if not isinstance(key, str) or key not in ALLOWED_KEYS or key in target:
            self.refuse(
                "key", repr(key), "only 'embedding' and 'mask_token_id' are allowed, once each"
            )
        target[key] = value

    def run(self, data):
        result = None
        try:
            opcodes = list(pickletools.genops(data))
        except (ValueError, EOFError) as error:
            self.refuse("data.pkl", str(error).splitlines()[0], "malformed pickle")
        for opcode, arg, _position in opcodes:
            if result is not None:
                self.refuse("data.pkl", opcode.name, "nothing may follow STOP")
            name = opcode.name
            if name in ("PROTO", "FRAME"):
                continue
            if name == "EMPTY_DICT":
                self.stack.append({})
            elif name == "EMPTY_TUPLE":
                self.stack.append(())
            elif name == "MARK":
                self.marks.append(len(self.stack))
            elif name == "TUPLE":
                self.stack.append(tuple(self.pop_to_mark()))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                count = int(name[-1])
                if len(self.stack) < count:
                    self.refuse("data.pkl", name, "malformed pickle")
                items = tuple(self.stack[-count:])
                del self.stack[-count:]
                self.stack.append(items)
            elif name in (
                "BINUNICODE",
                "SHORT_BINUNICODE",
                "BINUNICODE8",
                "BININT",
                "BININT1",
                "BININT2",
                "LONG1",
            ):
                self.stack.append(arg)
            elif name in ("NEWTRUE", "NEWFALSE"):
                self.stack.append(name == "NEWTRUE")
            elif name == "NONE":
                self.stack.append(None)
            elif name == "GLOBAL":
                module, _, attribute = arg.partition(" ")
                self.stack.append(self.global_(module, attribute))
            elif name == "STACK_GLOBAL":
                attribute, module = self.pop(), self.pop()
                if not (isinstance(module, str) and isinstance(attribute, str)):
                    self.refuse("data.pkl", "STACK_GLOBAL of non-strings", "malformed pickle")
                self.stack.append(self.global_(module, attribute))
            elif name in ("BINPUT", "LONG_BINPUT", "MEMOIZE"):
                if not self.stack:
                    self.refuse("data.pkl", name, "malformed pickle")
                self.memo[len(self.memo) if name == "MEMOIZE" else arg] = self.stack[-1]
            elif name in ("BINGET", "LONG_BINGET"):
                if arg not in self.memo:
                    self.refuse("data.pkl", f"{name} {arg}", "malformed pickle")
                self.stack.append(self.memo[arg])
            elif name == "BINPERSID":
                self.stack.append(self.persistent(self.pop()))
            elif name == "REDUCE":
                args, function = self.pop(), self.pop()
                if not isinstance(args, tuple):
                    self.refuse("data.pkl", "REDUCE without an argument tuple", "malformed pickle")
                self.stack.append(self.reduce(function, args))
            elif name == "SETITEM":
                value, key = self.pop(), self.pop()
                self.set_item(self.stack[-1] if self.stack else None, key, value)
            elif name == "SETITEMS":
                items = self.pop_to_mark()
                if len(items) % 2:
                    self.refuse("data.pkl", "SETITEMS with an odd item count", "malformed pickle")
                target = self.stack[-1] if self.stack else None
                for key, value in zip(items[::2], items[1::2]):
                    self.set_item(target, key, value)
            elif name == "STOP":
                result = self.pop()
                if self.stack or self.marks:
                    self.refuse("data.pkl", "values left before STOP", "malformed pickle")
            else:
                self.refuse(
                    "data.pkl opcode",
                    name,
                    "only the opcodes torch.save writes for one tensor are allowed",
                )
        if result is None:
            self.refuse("data.pkl", "no STOP", "malformed pickle")
        return result


def _entries(path, archive):
    """The zip's records by name below its one top-level folder; refuse compression and strangers."""
    infos = archive.infolist()
    prefixes = {info.filename.split("/", 1)[0] for info in infos}
    if len(prefixes) != 1 or any("/" not in info.filename for info in infos):
        raise Refused(
            path,
            "zip layout",
            sorted(info.filename for info in infos)[:4],
            "torch.save writes every record under one folder",
            _CONVERT,
        )
    records = {}
    for info in infos:
        record = info.filename.split("/", 1)[1]
        if info.compress_type != zipfile.ZIP_STORED:
            raise Refused(
                path,
                f"zip entry {info.filename}",
                f"compression {info.compress_type}",
                "entries must be stored uncompressed, as torch.save writes them",
                _CONVERT,
            )
        if info.flag_bits & 0x1:
            raise Refused(
                path, f"zip entry {info.filename}", "encrypted", "entries must be plain", _CONVERT
            )
        if (
            record not in METADATA_RECORDS
            and record != "data.pkl"
            and not record.startswith("data/")
        ):
            raise Refused(
                path,
                "zip entry",
                info.filename,
                "only torch.save's own records are allowed",
                _CONVERT,
            )
        records[record] = info
    return records


def read_mask_embedding(path, hidden_size):
    """The mask embedding in `path`, refused unless it is exactly one 1-D float vector of `hidden_size`."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise Refused(
            path,
            "format",
            "not a zip",
            "must be a torch.save zip file (legacy formats are refused)",
            _CONVERT,
        ) from None
    with archive:
        records = _entries(path, archive)
        if "byteorder" not in records:
            raise Refused(path, "byteorder", "missing", "the record must say 'little'", _CONVERT)
        byteorder = archive.read(records["byteorder"]).decode("ascii", "replace").strip()
        if byteorder != "little":
            raise Refused(path, "byteorder", byteorder, "must be 'little'", _CONVERT)
        if "data.pkl" not in records:
            raise Refused(path, "data.pkl", "missing", "a torch.save zip has data.pkl", _CONVERT)
        if records["data.pkl"].file_size > MAX_PICKLE_BYTES:
            raise Refused(
                path,
                "data.pkl size",
                records["data.pkl"].file_size,
                f"at most {MAX_PICKLE_BYTES} bytes for one tensor",
                _CONVERT,
            )
        top = _PickleWalk(path).run(archive.read(records["data.pkl"]))

        mask_token_id = None
        if isinstance(top, dict):
            if "embedding" not in top:
                raise Refused(
                    path, "key", "embedding missing", "a dict must hold 'embedding'", _CONVERT
                )
            mask_token_id = top.get("mask_token_id")
            if "mask_token_id" in top and not _is_int(mask_token_id):
                raise Refused(
                    path, "mask_token_id", repr(mask_token_id), "must be an integer", _CONVERT
                )
            top = top["embedding"]
        if not isinstance(top, _Tensor):
            raise Refused(path, "embedding", type(top).__name__, "must be a tensor", _CONVERT)

        storage = top.storage
        if (
            top.size != (hidden_size,)
            or top.stride != (1,)
            or top.offset != 0
            or storage.numel != hidden_size
        ):
            raise Refused(
                path,
                "embedding shape",
                list(top.size),
                f"must be one contiguous vector of the drafter's hidden_size [{hidden_size}]",
                _CONVERT,
            )
        data_records = {record for record in records if record.startswith("data/")}
        if data_records != {f"data/{storage.key}"}:
            raise Refused(
                path,
                "tensor data records",
                sorted(data_records),
                f"must be exactly data/{storage.key}, the embedding's own",
                _CONVERT,
            )
        record = records[f"data/{storage.key}"]
        if (
            record.file_size != storage.numel * storage.itemsize
        ):  # checked before reading a byte of it
            raise Refused(
                path,
                f"data/{storage.key} size",
                record.file_size,
                f"must be {storage.numel * storage.itemsize} bytes ({storage.numel} x {storage.dtype})",
                _CONVERT,
            )
        data = archive.read(record)
    return MaskEmbedding(dtype=storage.dtype, data=data, mask_token_id=mask_token_id)
