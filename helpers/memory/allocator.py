"""How a virtual GPU hands out memory: exact counting, or a simulation of PyTorch's CUDA allocator.

Pure Python, no torch: the engine calls ``malloc(n_bytes)`` when a tensor storage appears and
``free(handle)`` when it dies.

* :class:`ExactAllocator` counts every byte and nothing else: ``reserved == allocated``.
* :class:`CachingAllocator` follows the rules of PyTorch's ``CUDACachingAllocator``
  (c10/cuda/CUDACachingAllocator.cpp, default settings): sizes round up to 512-byte blocks;
  requests of at most 1 MiB share 2 MiB segments, requests under 10 MiB get a 20 MiB segment,
  larger ones a segment rounded up to 2 MiB; freed blocks stay cached (``reserved``) and are
  reused best-fit, split and merged again; when a new segment does not fit, the cache is
  emptied and the request retried before it fails.  What it leaves out: streams, graphs,
  expandable segments, ``max_split_size_mb`` and fragmentation of the device itself.

Both raise :class:`SimulatedOOM` when ``reserved + context`` would exceed the capacity.
"""

from __future__ import annotations

import bisect
import itertools

__all__ = [
    "ExactAllocator", "CachingAllocator", "SimulatedOOM", "round_size", "allocation_size",
    "MIN_BLOCK", "SMALL_SIZE", "SMALL_BUFFER", "MIN_LARGE_ALLOC", "LARGE_BUFFER", "ROUND_LARGE",
]

MiB = 1024**2
MIN_BLOCK = 512  # kMinBlockSize: every allocation is a multiple of 512 bytes
SMALL_SIZE = 1 * MiB  # kSmallSize: largest "small" request
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: segment size of the small pool
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: requests below this get a LARGE_BUFFER segment
LARGE_BUFFER = 20 * MiB  # kLargeBuffer
ROUND_LARGE = 2 * MiB  # kRoundLarge: larger segments round up to this


class SimulatedOOM(Exception):
    """A request does not fit; ``alloc_size`` is what the allocator tried to get."""

    def __init__(self, request_bytes: int, alloc_size: int):
        super().__init__(f"cannot allocate {alloc_size} bytes (request {request_bytes})")
        self.request_bytes = request_bytes
        self.alloc_size = alloc_size


def round_size(n_bytes: int) -> int:
    """Block size for a request: at least 512 bytes, a multiple of 512."""
    if n_bytes < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * -(-n_bytes // MIN_BLOCK)


def allocation_size(block_size: int) -> int:
    """Size of the segment (``cudaMalloc``) made for a block that fits no cached block."""
    if block_size <= SMALL_SIZE:
        return SMALL_BUFFER
    if block_size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-block_size // ROUND_LARGE)


class _Stats:
    def __init__(self, limit: int | None):
        self.limit = limit  # bytes the allocator may reserve (capacity - context), None: no cap
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.n_segments = 0
        self.n_oom = 0

    def reset_peak(self) -> None:
        self.peak_allocated_bytes = self.allocated_bytes
        self.peak_reserved_bytes = self.reserved_bytes


class ExactAllocator(_Stats):
    """Counts exact storage bytes; ``reserved_bytes`` equals ``allocated_bytes``."""

    rounding = False

    def malloc(self, n_bytes: int, quiet: bool = False):
        """A handle for ``n_bytes``; SimulatedOOM when they do not fit (counted in ``n_oom``
        unless ``quiet``: a caller that falls back, as cuDNN does, raised no error)."""
        if n_bytes <= 0:
            return None
        if self.limit is not None and self.allocated_bytes + n_bytes > self.limit:
            self.n_oom += not quiet
            raise SimulatedOOM(n_bytes, n_bytes)
        self.allocated_bytes += n_bytes
        self.reserved_bytes = self.allocated_bytes
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes
            self.peak_reserved_bytes = self.allocated_bytes
        return n_bytes

    def free(self, handle) -> None:
        if handle is None:
            return
        self.allocated_bytes -= handle
        self.reserved_bytes = self.allocated_bytes

    def block_size(self, handle) -> int:
        return 0 if handle is None else handle

    def empty_cache(self) -> None:
        """Nothing is cached."""


class _Block:
    __slots__ = ("size", "offset", "segment", "prev", "next", "free", "small")

    def __init__(self, size, offset, segment, small):
        self.size = size
        self.offset = offset
        self.segment = segment
        self.prev = None
        self.next = None
        self.free = True
        self.small = small

    def key(self):
        return (self.size, self.segment, self.offset)


class _Pool:
    """Free blocks of one pool, sorted by (size, segment, offset) for best-fit search."""

    def __init__(self):
        self.keys: list[tuple[int, int, int]] = []
        self.blocks: dict[tuple[int, int, int], _Block] = {}

    def add(self, block: _Block) -> None:
        key = block.key()
        bisect.insort(self.keys, key)
        self.blocks[key] = block

    def remove(self, block: _Block) -> None:
        key = block.key()
        i = bisect.bisect_left(self.keys, key)
        del self.keys[i]
        del self.blocks[key]

    def best_fit(self, size: int) -> _Block | None:
        i = bisect.bisect_left(self.keys, (size, -1, -1))
        if i == len(self.keys):
            return None
        return self.blocks[self.keys[i]]


class CachingAllocator(_Stats):
    """A simulation of PyTorch's CUDA caching allocator (one device, one stream)."""

    rounding = True

    def __init__(self, limit: int | None):
        super().__init__(limit)
        self._small = _Pool()
        self._large = _Pool()
        self._segment_ids = itertools.count()
        self._segment_sizes: dict[int, int] = {}

    def malloc(self, n_bytes: int, quiet: bool = False):
        """A block for ``n_bytes``; SimulatedOOM when no segment fits, even after the cache
        is emptied (counted in ``n_oom`` unless ``quiet``)."""
        if n_bytes <= 0:
            return None
        size = round_size(n_bytes)
        small = size <= SMALL_SIZE
        pool = self._small if small else self._large
        block = pool.best_fit(size)
        if block is not None:
            pool.remove(block)
        else:
            alloc = allocation_size(size)
            if self.limit is not None and self.reserved_bytes + alloc > self.limit:
                self.empty_cache()  # like release_cached_blocks(), then retry
                if self.reserved_bytes + alloc > self.limit:
                    self.n_oom += not quiet
                    raise SimulatedOOM(n_bytes, alloc)
            seg = next(self._segment_ids)
            self._segment_sizes[seg] = alloc
            self.reserved_bytes += alloc
            self.n_segments += 1
            block = _Block(alloc, 0, seg, small)
        remaining = block.size - size
        if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_SIZE):
            rest = _Block(remaining, block.offset + size, block.segment, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.add(rest)
        block.free = False
        self.allocated_bytes += block.size
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes
        return block

    def free(self, block: _Block | None) -> None:
        if block is None:
            return
        self.allocated_bytes -= block.size
        block.free = True
        pool = self._small if block.small else self._large
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                pool.remove(neighbour)
                if neighbour is block.prev:
                    block.offset = neighbour.offset
                    block.prev = neighbour.prev
                    if neighbour.prev is not None:
                        neighbour.prev.next = block
                else:
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
                block.size += neighbour.size
        pool.add(block)

    def block_size(self, block: _Block | None) -> int:
        return 0 if block is None else block.size

    def empty_cache(self) -> None:
        """Give back every segment that is entirely free (``torch.cuda.empty_cache()``)."""
        for pool in (self._small, self._large):
            whole = [b for b in pool.blocks.values() if b.prev is None and b.next is None]
            for block in whole:
                pool.remove(block)
                self.reserved_bytes -= block.size
                del self._segment_sizes[block.segment]

    @property
    def segments(self) -> dict[int, int]:
        """Live segments: id -> size in bytes."""
        return dict(self._segment_sizes)
