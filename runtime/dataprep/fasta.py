"""Streaming FASTA reader and protein tokeniser (no torch, no whole-file reads).

`encode`/`decode` map between residue strings and token ids of `planner.schema.vocab`
(<bos> residues <eos>). `read_fasta` walks a plain or gzip FASTA file line by line, in
constant memory whatever the file size (a record longer than `max_len` stops being
accumulated as soon as it is known to be too long), and yields one `FastaRecord` per
record: either its tokens or the reason it was skipped. Files that are not FASTA at all
(no '>' header before the first data line, unreadable gzip, empty) raise PlanError.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from planner.schema.errors import PlanError
from planner.schema.vocab import BOS_ID, EOS_ID, TOKEN_TO_ID, TOKENS

# Every letter A-Z is in the vocabulary (20 standard + B Z J X U O), upper or lower case.
ALPHABET = bytes(sorted({ord(t) for t in TOKENS if len(t) == 1}))
_ALPHABET_BOTH = ALPHABET + ALPHABET.lower()
# bytes.translate table: letter (either case) -> token id; anything else -> 255 (never used:
# records with other characters are skipped before translation).
_TABLE = bytearray([255]) * 256
for _c in ALPHABET:
    _TABLE[_c] = TOKEN_TO_ID[chr(_c)]
    _TABLE[ord(chr(_c).lower())] = TOKEN_TO_ID[chr(_c)]
_TABLE = bytes(_TABLE)
_WHITESPACE = b" \t\r\n\v\f"
_BOS = bytes([BOS_ID])
_EOS = bytes([EOS_ID])
_ID_TO_CHAR = np.array([t if len(t) == 1 else "" for t in TOKENS], dtype=object)

# Skip reasons (keys of PrepareReport.skipped and of the manifest's "skipped").
SKIP_EMPTY = "empty_sequence"       # a header with no sequence lines (truncated record)
SKIP_LETTER = "invalid_character"   # a character outside the protein alphabet
SKIP_TOO_LONG = "too_long"          # more residues than max_len
SKIP_NO_ID = "missing_id"           # '>' with nothing after it
SKIP_REASONS = (SKIP_EMPTY, SKIP_LETTER, SKIP_TOO_LONG, SKIP_NO_ID)


def encode(sequence: str | bytes) -> np.ndarray:
    """Residues -> uint8 token ids `<bos> residues <eos>` (case-insensitive; one terminal '*'
    stop codon dropped). Raises PlanError on a character outside the alphabet."""
    seq = sequence.encode("ascii", "replace") if isinstance(sequence, str) else bytes(sequence)
    seq = seq.translate(None, _WHITESPACE)
    if seq.endswith(b"*"):
        seq = seq[:-1]
    bad = seq.translate(None, _ALPHABET_BOTH)
    if bad:
        raise PlanError(f"character {chr(bad[0])!r} is not in the protein alphabet (A-Z)")
    return np.frombuffer(_BOS + seq.translate(_TABLE) + _EOS, dtype=np.uint8).copy()


def decode(tokens) -> str:
    """Token ids -> residue string; special tokens (<bos>, <eos>, <pad>, ...) are dropped."""
    ids = np.asarray(tokens, dtype=np.int64).ravel()
    if ids.size and (ids.min() < 0 or ids.max() >= len(TOKENS)):
        raise PlanError(f"token id out of range 0..{len(TOKENS) - 1}")
    return "".join(_ID_TO_CHAR[ids])


@dataclass
class FastaRecord:
    id: str
    line: int                   # 1-based line number of the header
    residues: int               # residues counted (for too_long: at least max_len + 1)
    tokens: bytes | None        # <bos> residues <eos> as uint8 ids; None when skipped
    skip: str | None = None     # one of SKIP_REASONS
    detail: str = ""            # e.g. "character '1' at residue 17"


class HashingRaw(io.RawIOBase):
    """A raw file that hashes (sha256) and counts every byte read through it."""

    def __init__(self, path: str):
        self._f = open(path, "rb", buffering=0)
        self.sha256 = hashlib.sha256()
        self.pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self._f.readinto(b)
        if n:
            self.sha256.update(memoryview(b)[:n])
            self.pos += n
        return n

    def drain(self) -> None:
        buf = bytearray(1 << 20)
        while self.readinto(buf):
            pass

    def close(self) -> None:
        self._f.close()
        super().close()


def is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


class FastaFile:
    """One FASTA file being read: iterate `records(max_len)`; afterwards `sha256`,
    `bytes_read` and `compressed` describe it. `on_bytes(n)` is called with the number of
    new on-disk bytes consumed (for a progress bar), about every MiB."""

    def __init__(self, path: str, on_bytes: Callable[[int], None] | None = None):
        self.path = str(path)
        if not os.path.exists(self.path):
            raise PlanError(f"{self.path}: no such file")
        if os.path.isdir(self.path):
            raise PlanError(f"{self.path}: is a directory, not a FASTA file")
        self.size = os.path.getsize(self.path)
        if self.size == 0:
            raise PlanError(f"{self.path}: empty file (no FASTA records)")
        try:
            self.compressed = is_gzip(self.path)
        except OSError as err:
            raise PlanError(f"{self.path}: cannot open: {err.strerror or err}") from None
        self.on_bytes = on_bytes
        self.sha256 = ""
        self.bytes_read = 0

    def records(self, max_len: int) -> Iterator[FastaRecord]:
        """Every record, line by line (the reference reader; prepare reads in blocks,
        runtime/dataprep/blocks.py, and gives the same records)."""
        try:
            raw = HashingRaw(self.path)
        except OSError as err:
            raise PlanError(f"{self.path}: cannot open: {err.strerror or err}") from None
        reported = 0
        parser = LineParser(self.path, max_len)
        try:
            buffered = io.BufferedReader(raw, 1 << 18)
            stream = gzip.GzipFile(fileobj=buffered, mode="rb") if self.compressed else buffered
            try:
                for line in stream:
                    if self.on_bytes is not None and raw.pos - reported >= (1 << 20):
                        self.on_bytes(raw.pos - reported)
                        reported = raw.pos
                    done = parser.line(line)
                    if done is not None:
                        yield done
                done = parser.end()
                if done is not None:
                    yield done
            except (EOFError, zlib.error, OSError) as err:  # gzip.BadGzipFile is an OSError
                raise self.read_error(err, parser.lineno) from None
            raw.drain()
            self.sha256 = raw.sha256.hexdigest()
            self.bytes_read = raw.pos
            if self.on_bytes is not None and raw.pos > reported:
                self.on_bytes(raw.pos - reported)
        finally:
            raw.close()

    @contextlib.contextmanager
    def stream(self):
        """`read(n)`: up to n bytes of the file's content (decompressed), b"" at its end. On a
        clean exit the whole file has been hashed (sha256) and counted (bytes_read)."""
        try:
            raw = HashingRaw(self.path)
        except OSError as err:
            raise PlanError(f"{self.path}: cannot open: {err.strerror or err}") from None
        reported = 0
        try:
            buffered = io.BufferedReader(raw, 1 << 18)
            stream = gzip.GzipFile(fileobj=buffered, mode="rb") if self.compressed else buffered

            def read(n: int) -> bytes:
                nonlocal reported
                data = stream.read(n)
                if self.on_bytes is not None and raw.pos > reported:
                    self.on_bytes(raw.pos - reported)
                    reported = raw.pos
                return data

            yield read
            raw.drain()
            self.sha256 = raw.sha256.hexdigest()
            self.bytes_read = raw.pos
            if self.on_bytes is not None and raw.pos > reported:
                self.on_bytes(raw.pos - reported)
        finally:
            raw.close()

    def read_error(self, err: BaseException, lines: int) -> PlanError:
        """The PlanError of a read or decompression error after `lines` lines."""
        what = "truncated or corrupt gzip data" if self.compressed else "read error"
        return PlanError(f"{self.path}: {what} near line {lines + 1}: {err}")


class LineParser:
    """The FASTA grammar, one line (ending in b"\\n", or the file's last) at a time: `line`
    returns the record a header line ends, `end` the last one (PlanError for sequence data
    before the first header, or for no header at all). A record longer than `max_len` stops
    being accumulated as soon as it is known to be too long."""

    def __init__(self, path: str, max_len: int, lineno: int = 0, seen_header: bool = False):
        self.path, self.max_len = path, max_len
        self.lineno = lineno            # lines seen
        self.seen_header = seen_header
        self.header: bytes | None = None
        self.header_line = 0
        self.chunks: list[bytes] = []
        self.length = 0                 # residues accumulated (or counted, once too long)
        self.too_long = False

    def line(self, line: bytes) -> FastaRecord | None:
        self.lineno += 1
        if line[:1] == b">":
            done = self.end_record()
            self.header, self.header_line, self.chunks, self.length, self.too_long = line, self.lineno, [], 0, False
            self.seen_header = True
            return done
        stripped = line.translate(None, _WHITESPACE)
        if not stripped or line[:1] == b";":   # blank line or old-style comment
            return None
        if not self.seen_header:
            raise PlanError(f"{self.path} line {self.lineno}: sequence data before the first '>' header: "
                            "not a FASTA file (or truncated at the start)")
        self.length += len(stripped)
        if self.too_long:
            return None
        if self.length > self.max_len + 1:    # +1: a terminal '*' does not count
            self.too_long, self.chunks = True, []
        else:
            self.chunks.append(stripped)
        return None

    def end_record(self) -> FastaRecord | None:
        """The record being read, finished (None before the first header)."""
        if self.header is None:
            return None
        done = finish_record(self.header, self.header_line, self.chunks, self.length, self.too_long, self.max_len)
        self.header, self.chunks = None, []
        return done

    def end(self) -> FastaRecord | None:
        """The last record; PlanError when the file had no header at all."""
        done = self.end_record()
        if not self.seen_header:
            raise PlanError(f"{self.path}: no FASTA records (no line starts with '>')")
        return done


def record_id(header: bytes) -> str:
    """A header line's record id: its first word after '>' ("" when it has none)."""
    words = header[1:].split(None, 1)
    return words[0].decode("utf-8", "replace") if words else ""


def finish_record(header: bytes, lineno: int, chunks: list[bytes], length: int, too_long: bool,
                  max_len: int) -> FastaRecord:
    rid = record_id(header)
    if not rid:
        return FastaRecord("", lineno, length, None, SKIP_NO_ID, "header line has no identifier")
    if too_long:
        return FastaRecord(rid, lineno, length, None, SKIP_TOO_LONG, f"{length} residues > max_len {max_len}")
    seq = b"".join(chunks)
    if seq.endswith(b"*"):
        seq = seq[:-1]
    if not seq:
        return FastaRecord(rid, lineno, 0, None, SKIP_EMPTY, "header with no sequence")
    if len(seq) > max_len:
        return FastaRecord(rid, lineno, len(seq), None, SKIP_TOO_LONG, f"{len(seq)} residues > max_len {max_len}")
    bad = seq.translate(None, _ALPHABET_BOTH)
    if bad:
        pos = seq.index(bad[:1]) + 1
        char = bad[:1].decode("latin-1")
        return FastaRecord(rid, lineno, len(seq), None, SKIP_LETTER, f"character {char!r} at residue {pos}")
    return FastaRecord(rid, lineno, len(seq), _BOS + seq.translate(_TABLE) + _EOS)


__all__ = ["ALPHABET", "FastaFile", "FastaRecord", "LineParser", "SKIP_REASONS", "decode", "encode", "finish_record",
           "is_gzip", "record_id"]
