"""Paged KV-cache bookkeeping: a fixed pool of blocks, ref counts, prefix cache, copy-on-write.

Prefix caching: every full block gets a chained hash hash(parent_hash, its key): its token ids,
and for image placeholder positions the image's content hash. A cached
block is found by that hash, and the stored token ids and parent hash are compared as a guard
against hash collisions. Freed blocks keep their hash and stay findable until they are evicted,
least recently freed first; blocks without a hash are handed out before any cached one.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from llm_engine.sequence import BlockKey, Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "parent_hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.parent_hash: int | None = None
        self.token_ids: BlockKey = ()


def hash_block(parent_hash: int | None, token_ids: BlockKey) -> int:
    """Chained hash of one full block: depends on every token before it via parent_hash."""
    return hash((parent_hash, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_uncached: deque[int] = deque(range(num_blocks))
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of which found cached

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_uncached) + len(self.free_cached)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached run of full blocks at the start of seq.

        At least one token is always left to compute, so that the step yields logits.
        """
        if not self.enable_prefix_caching:
            return []
        found: list[int] = []
        parent: int | None = None
        bs = self.block_size
        for i in range((seq.num_tokens - 1) // bs):
            tokens = seq.block_key(i, bs)
            block_hash = hash_block(parent, tokens)
            block_id = self.cached.get(block_hash)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.token_ids != tokens or block.parent_hash != parent:
                break  # hash collision: a different block owns this hash
            found.append(block_id)
            parent = block_hash
        return found

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_queries += num_tokens
        self.prefix_hits += num_hit_tokens

    def allocate_slots(self, seq: Sequence, num_new_tokens: int,
                       cached_blocks: list[int] | None = None) -> list[tuple[int, int]] | None:
        """Give seq room for num_new_tokens more tokens (after any cached prefix blocks).

        Returns the (src, dst) block copies needed for copy-on-write, or None if the pool is too
        small right now (nothing is changed then).
        """
        cached_blocks = cached_blocks or []
        bs = self.block_size
        start = seq.num_computed_tokens + len(cached_blocks) * bs
        new_blocks = self.blocks_needed(start + num_new_tokens) - len(seq.block_table) - len(cached_blocks)
        write_index = start // bs
        copy_on_write = (start % bs != 0 and write_index < len(seq.block_table)
                         and self.blocks[seq.block_table[write_index]].ref_count > 1)
        revived = sum(1 for b in cached_blocks if self.blocks[b].ref_count == 0)
        if max(new_blocks, 0) + int(copy_on_write) + revived > self.num_free_blocks:
            return None
        for block_id in cached_blocks:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_cached[block_id]
            block.ref_count += 1
            assert block.hash is not None  # found by its hash in self.cached
            seq.block_table.append(block_id)
            seq.block_hashes.append(block.hash)
        seq.num_computed_tokens = start
        copies: list[tuple[int, int]] = []
        if copy_on_write:
            shared = seq.block_table[write_index]
            self.blocks[shared].ref_count -= 1
            private = self._take_free_block()
            seq.block_table[write_index] = private
            copies.append((shared, private))
        for _ in range(max(new_blocks, 0)):
            seq.block_table.append(self._take_free_block())
        return copies

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks of seq that became full of computed tokens in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
            parent = seq.block_hashes[i - 1] if i else None
            tokens = seq.block_key(i, bs)
            block_hash = hash_block(parent, tokens)
            seq.block_hashes.append(block_hash)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and block_hash not in self.cached:
                block.hash, block.parent_hash, block.token_ids = block_hash, parent, tokens
                self.cached[block_hash] = block.block_id

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (their contents are gone, e.g. a restarted worker group), once
        no sequence holds a block. A block still held for a KV transfer (its pull may be under way
        as the group restarts) is forgotten too, and comes back uncached when the transfer lets go."""
        for block in self.blocks:
            block.hash, block.parent_hash, block.token_ids = None, None, ()
        self.cached.clear()
        self.free_uncached.extend(self.free_cached)
        self.free_cached.clear()

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let child share every block of parent (copy-on-write protects the partial last block)."""
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)

    def free(self, seq: Sequence) -> None:
        """Drop seq's references; tail blocks are freed first so prefixes are evicted last."""
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.block_hashes = []

    def trim(self, seq: Sequence) -> None:
        """Free seq's blocks past its tokens: those that only held a rejected draft's slots."""
        keep = self.blocks_needed(seq.num_tokens)
        for block_id in reversed(seq.block_table[keep:]):
            self._release(block_id)
        del seq.block_table[keep:]

    def hold(self, block_ids: list[int]) -> list[int]:
        """One more reference on each block (kept for a KV transfer after its sequence is freed)."""
        for block_id in block_ids:
            self.blocks[block_id].ref_count += 1
        return list(block_ids)

    def release(self, block_ids: list[int]) -> None:
        """Drop references taken by `hold`, tail blocks first."""
        for block_id in reversed(block_ids):
            self._release(block_id)

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.hash is not None:
                self.free_cached[block_id] = None
            else:
                self.free_uncached.append(block_id)

    def _take_free_block(self) -> int:
        if self.free_uncached:
            block_id = self.free_uncached.popleft()
        else:
            block_id, _ = self.free_cached.popitem(last=False)
            block = self.blocks[block_id]
            assert block.hash is not None  # free_cached holds only blocks with a hash
            del self.cached[block.hash]
            block.hash, block.parent_hash, block.token_ids = None, None, ()
        self.blocks[block_id].ref_count = 1
        return block_id
