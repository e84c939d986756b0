"""Chunk identity: a chunk file is valid only in its own place.

zarr's crc32c codec checks a chunk's bytes, not which chunk they are: a chunk file moved to another
index, swapped with another, or copied from another store of the same layout would decode as valid
data in the wrong rows.  In a store of schema 3 every chunk's stored checksum is bound to its place:

    stored = crc32c(chunk bytes) XOR tag(store_uid, key)

where ``key`` is the chunk's key in the store (``gallery/features/c/3/0``: the array's path and the
chunk's index) and ``tag`` four bytes of a BLAKE2b hash of the store's unique id and that key.
``ChunkIdentityStore`` wraps the zarr store of such a store and applies the tag to every chunk it
writes and removes it from every chunk it reads, so zarr's own crc32c codec, on its one pass over
the bytes, checks the bytes and the place together: a chunk read anywhere but where it was written
fails its checksum.  The tag costs a hash of a short string per chunk, no pass over the data.
Chunk reads of a local store read the file into memory of their own (that the tag can be removed
in place, without copying the chunk).

A whole-store copy keeps the uid and every key, so it stays valid; ``convert`` writes a new store
(a new uid).  Stores of schema 2 (no identity) read as before; ``upgrade`` binds their chunks in
place (``streameval validate --upgrade``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os

import google_crc32c
import numpy as np
import zarr
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.common import concurrent_map
from zarr.core.sync import sync
from zarr.storage import LocalStore, WrapperStore

from ..core.errors import StoreError, one_line

IDENTITY_SCHEMA = 3  # the first store schema whose chunk checksums carry the chunk's identity
UPGRADING_ATTR = "chunk_identity_upgrade"  # set while ``upgrade`` rebinds the chunks of a schema 2 store
CHECKSUM_BYTES = 4


def is_chunk_key(key: str) -> bool:
    """A chunk of an array in zarr v3's default key encoding (``ARRAY/c/I/J``), not a metadata document."""
    return "/c/" in key and key.rsplit("/", 1)[-1] != "zarr.json"


def plain_store(store):
    """The zarr store under a ChunkIdentityStore (the store itself otherwise)."""
    return store._store if isinstance(store, ChunkIdentityStore) else store


def chunk_tag(uid: str, key: str) -> int:
    """The four bytes (as an int) a chunk's checksum is XORed with at ``key`` in the store ``uid``."""
    return int.from_bytes(hashlib.blake2b(f"{uid}\0{key}".encode(), digest_size=CHECKSUM_BYTES).digest(), "little")


def _retagged(data: np.ndarray, tag: int) -> None:
    """XOR the checksum at the end of a chunk's bytes (writable ``data``) with ``tag``: applies or
    removes it (XOR is its own inverse)."""
    if data.shape[0] >= CHECKSUM_BYTES:  # shorter: damaged, left for the codec to refuse
        end = data[-CHECKSUM_BYTES:]
        end[:] = np.frombuffer((int.from_bytes(end.tobytes(), "little") ^ tag).to_bytes(CHECKSUM_BYTES, "little"),
                               np.uint8)


def _reaches_checksum(byte_range) -> bool:
    """Whether a read returns the chunk's last CHECKSUM_BYTES bytes (whole or from an offset)."""
    return (byte_range is None or isinstance(byte_range, OffsetByteRequest)
            or (isinstance(byte_range, SuffixByteRequest) and byte_range.suffix >= CHECKSUM_BYTES))


def _cut(data: np.ndarray, byte_range) -> np.ndarray:
    """The part of a chunk's bytes a range read asks for (a copy)."""
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start:byte_range.end].copy()
    return data[data.shape[0] - min(byte_range.suffix, data.shape[0]):].copy()


def _read_file(path: str) -> np.ndarray | None:
    """A local chunk file read into writable memory (None when it does not exist), as zarr's
    LocalStore reads it but without the immutable ``bytes`` in between."""
    try:
        with open(path, "rb") as f:
            data = np.empty(os.fstat(f.fileno()).st_size, dtype=np.uint8)
            return data[:f.readinto(memoryview(data))]
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


class ChunkIdentityStore(WrapperStore):
    """A zarr store (local, fsspec or in memory) whose chunks' checksums carry their identity
    (module docstring): chunks are tagged as they are written and untagged as they are read."""

    def __init__(self, store, uid: str) -> None:
        super().__init__(store)
        self.uid = uid

    def _with_store(self, store):
        return type(self)(store, self.uid)

    def __eq__(self, value: object) -> bool:
        return super().__eq__(value) and self.uid == value.uid

    def __repr__(self) -> str:
        return f"ChunkIdentityStore({self._store!r})"

    def __str__(self) -> str:
        return str(self._store)

    async def get(self, key, prototype=None, byte_range=None):
        if not is_chunk_key(key):
            return await self._store.get(key, prototype, byte_range)
        prototype = prototype or default_buffer_prototype()
        if not _reaches_checksum(byte_range):  # a range that may or may not hold the checksum: rare
            whole = await self.get(key, prototype)
            return None if whole is None else prototype.buffer.from_array_like(_cut(whole.as_numpy_array(), byte_range))
        data = await self._ending(key, prototype, byte_range)
        if data is None:
            return None
        _retagged(data, chunk_tag(self.uid, key))
        return prototype.buffer.from_array_like(data)

    async def _ending(self, key, prototype, byte_range) -> np.ndarray | None:
        """The bytes of a read that ends with the whole checksum, writable and this read's own."""
        if byte_range is None and isinstance(self._store, LocalStore):
            return await asyncio.to_thread(_read_file, os.path.join(self._store.root, key))
        buffer = await self._store.get(key, prototype, byte_range)
        return None if buffer is None else np.array(buffer.as_numpy_array(), dtype=np.uint8)  # a copy: shared memory

    async def get_partial_values(self, prototype, key_ranges):
        return await concurrent_map(list(key_ranges), lambda key, byte_range: self.get(key, prototype, byte_range),
                                    zarr.config.get("async.concurrency"))

    async def _get_many(self, requests):
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)

    async def set(self, key, value) -> None:
        await self._store.set(key, self._tagged(key, value))

    async def set_if_not_exists(self, key, value) -> None:
        await self._store.set_if_not_exists(key, self._tagged(key, value))

    async def _set_many(self, values) -> None:
        await self._store._set_many([(key, self._tagged(key, value)) for key, value in values])

    def _tagged(self, key, value):
        if not is_chunk_key(key):
            return value
        data = np.array(value.as_numpy_array(), dtype=np.uint8)  # zarr's buffer stays as it was
        _retagged(data, chunk_tag(self.uid, key))
        return value.from_array_like(data)


def bound_group(group: zarr.Group, uid: str, mode: str) -> zarr.Group:
    """``group`` reopened on its zarr store wrapped in a ChunkIdentityStore (once)."""
    return zarr.open_group(ChunkIdentityStore(plain_store(group.store), uid), mode=mode)


# ---------------------------------------------------------------------------------- explaining a failure


DAMAGED = "the store is damaged: restore that file or recreate the store"


def checksum_failure(arr: zarr.Array, key: str) -> tuple[str, str]:
    """Why the chunk at ``key`` of ``arr``, whose read failed its crc32c checksum, fails, and what to
    do: when its bytes are intact in a store with chunk identity, it carries another chunk's
    identity (moved or swapped) or none (copied from a store without chunk identity); otherwise its
    bytes are damaged, or (in a store with chunk identity: the two read alike) it comes from another
    store."""
    bytes_wrong = "its crc32c checksum does not match its bytes"
    store = arr.store_path.store
    if not isinstance(store, ChunkIdentityStore):
        return bytes_wrong, DAMAGED
    raw = sync(store._store.get(key, default_buffer_prototype()))
    data = b"" if raw is None else raw.to_bytes()
    found = None if len(data) < CHECKSUM_BYTES else \
        google_crc32c.value(data[:-CHECKSUM_BYTES]) ^ int.from_bytes(data[-CHECKSUM_BYTES:], "little")
    place = "its crc32c checksum does not match its place"
    if found == 0:
        return (f"{place}: it carries no chunk identity (copied from a store without one, or written by another "
                "tool than streameval)", "restore that file or recreate the store")
    origin = None if found is None else _origin(arr, store.uid, found)
    if origin is not None:
        return (f"{place}: it holds the chunk {origin} of this store (chunk files moved or swapped)",
                "put the chunk files back in their places or recreate the store")
    return bytes_wrong, "the store is damaged, or that file comes from another store: restore it or recreate the store"


def _origin(arr: zarr.Array, uid: str, tag: int) -> str | None:
    """The key of the chunk of this store whose tag is ``tag`` (searched only after a failure:
    a hash per chunk of the store)."""
    root = zarr.open_group(arr.store_path.store, mode="r")
    for _, array in _arrays(root):
        for coords in np.ndindex(*array.cdata_shape):
            key = f"{array.path}/{array.metadata.encode_chunk_key(coords)}"
            if chunk_tag(uid, key) == tag:
                return key
    return None


def _arrays(root: zarr.Group):
    return [(name, member) for name, member in root.members(max_depth=None) if isinstance(member, zarr.Array)]


# ------------------------------------------------------------------------------------------ upgrading


def upgrade(group: zarr.Group, uid, where: str, say=None) -> int:
    """Bind every chunk of a schema 2 store (opened as ``group`` on its plain zarr store, ``uid`` its
    store_uid) to its place, then mark the store schema 3; returns the number of chunks bound.

    Each chunk file is replaced atomically (zarr's LocalStore writes a temporary file and renames
    it); the store is marked as being upgraded first, so an interrupted upgrade is refused by
    readers until it is run again, which skips the chunks already bound.  A chunk whose bytes fail
    both checksums is damaged: StoreError naming it, the store left marked for a rerun.
    """
    if not isinstance(uid, str) or not uid:
        raise StoreError(f"'{where}': attribute store_uid is {uid!r}, not a store id (the store's metadata is "
                         "damaged)")
    group.attrs[UPGRADING_ATTR] = True
    store = group.store
    keys = sorted(key for _, array in _arrays(group) for key in sync(_chunk_keys(store, array.path)))
    bound = sum(_bind(store, key, uid, where) for key in keys)
    attrs = {name: value for name, value in group.attrs.asdict().items() if name != UPGRADING_ATTR}
    group.attrs.put({**attrs, "streameval_schema": IDENTITY_SCHEMA})  # one write of the group's metadata
    if say:
        say(f"bound {bound:,} chunks to their place ({len(keys) - bound:,} were already)")
    return bound


async def _chunk_keys(store, array_path: str) -> list[str]:
    return [key async for key in store.list_prefix(f"{array_path}/c/") if is_chunk_key(key)]


def _bind(store, key: str, uid: str, where: str) -> int:
    """Tag one chunk file if it is untagged (1), leave it if tagged already (0)."""
    prototype = default_buffer_prototype()
    try:
        raw = sync(store.get(key, prototype))
    except Exception as exc:
        raise StoreError(f"'{where}': cannot read the chunk {key} ({one_line(exc)})") from None
    if raw is None:  # removed since it was listed
        return 0
    data = np.array(raw.as_numpy_array(), dtype=np.uint8)
    crc = google_crc32c.value(data[:-CHECKSUM_BYTES].tobytes()) if data.shape[0] >= CHECKSUM_BYTES else None
    stored = int.from_bytes(data[-CHECKSUM_BYTES:].tobytes(), "little")
    tag = chunk_tag(uid, key)
    if crc == stored ^ tag:
        return 0
    if crc != stored:
        raise StoreError(f"'{where}': the chunk {key} fails its crc32c checksum (the file is damaged): restore it "
                         "or recreate the store, then run 'streameval validate --upgrade' again")
    _retagged(data, tag)
    sync(store.set(key, prototype.buffer.from_array_like(data)))
    return 1
