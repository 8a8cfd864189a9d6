"""The prefix cache (SGLang's RadixAttention): prompt token ids -> the pool slots holding their KV.

A radix tree whose edges are runs of token ids; a node holds the slots of its edge's tokens (the
KV of token i depends only on tokens 0..i, so any request whose prompt starts with a node's path
may read those slots). Slots in the tree belong to the tree, never to a request:

- a request that reads a node's path holds a *lock* on it (`lock` counts on the node and every
  ancestor); locked slots are never freed;
- unlocked leaves are *evictable*: `evict` frees them, least recently used first, when the pool
  needs room (a parent becomes a leaf, and evictable, once its last child goes);
- `reset` (`/flush_cache`, every weight update) drops the whole tree at once: unlocked slots are
  freed now; locked ones stay readable by their holders and are freed when the last lock goes,
  but no later request can match them (KV computed with old weights is never reused).

Only prompts are cached: a compressed response's KV is not the dense KV of its tokens.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import torch

_clock = itertools.count()


@dataclass(eq=False)
class Node:
    tokens: list[int]
    slots: torch.Tensor  # int64, one per token of the edge
    parent: "Node | None" = None
    children: dict[int, "Node"] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    detached: bool = False  # dropped by reset: freed when its last lock goes


@dataclass
class Match:
    node: "Node"  # deepest node of the matched path (the root when nothing matched)
    slots: torch.Tensor  # the matched tokens' slots, in order

    @property
    def length(self) -> int:
        return self.slots.numel()


class PrefixCache:
    def __init__(self, free_slots, device: torch.device):
        """`free_slots(tensor)`: give slots back to the pool's allocator."""
        self.free_slots, self.device = free_slots, device
        self.hit_tokens = 0  # prompt tokens served from the tree (stat)
        self.reset()

    def reset(self) -> None:
        """Drop every node; unlocked slots go back to the pool now, locked ones at their unlock."""
        old = getattr(self, "root", None)
        self.root = Node([], torch.empty(0, dtype=torch.int64, device=self.device))
        self.root.lock_ref = 1  # never evicted
        self.cached_tokens = 0  # slots in the tree
        self.evictable = 0  # slots in unlocked nodes
        if old is not None:
            for node in _descendants(old):
                node.detached = True
                if node.lock_ref == 0:
                    self.free_slots(node.slots)

    # ---------------------------------------------------------------- lookup and insertion

    def match(self, tokens: list[int]) -> Match:
        """The longest cached prefix of `tokens`; a partly matched edge is split so the match
        ends on a node."""
        node, parts, i = self.root, [], 0
        stamp = next(_clock)
        while i < len(tokens) and tokens[i] in node.children:
            child = node.children[tokens[i]]
            n = _common(child.tokens, tokens, i)
            if n < len(child.tokens):
                child = self._split(child, n)
            child.last_access = stamp
            parts.append(child.slots)
            node, i = child, i + n
        return Match(node, torch.cat(parts) if parts else self.root.slots)

    def insert(self, tokens: list[int], slots: torch.Tensor) -> tuple[Match, int]:
        """Cache `tokens` (whose KV is in `slots`); returns the match of the whole of them and
        how many were cached already. Those keep the tree's slots (the match has them): the
        caller frees its own duplicates."""
        m = self.match(tokens)
        existed = m.length
        if existed < len(tokens):
            node = Node(list(tokens[existed:]), slots[existed:len(tokens)].clone(), m.node,
                        last_access=next(_clock))
            m.node.children[tokens[existed]] = node
            self.cached_tokens += node.slots.numel()
            self.evictable += node.slots.numel()
            m = Match(node, torch.cat([m.slots, node.slots]))
        return m, existed

    def _split(self, child: Node, n: int) -> Node:
        """Cut `child`'s edge after n tokens; returns the new upper node."""
        upper = Node(child.tokens[:n], child.slots[:n], child.parent, lock_ref=child.lock_ref,
                     last_access=child.last_access, detached=child.detached)
        upper.children[child.tokens[n]] = child
        child.parent.children[child.tokens[0]] = upper
        child.tokens, child.slots, child.parent = child.tokens[n:], child.slots[n:], upper
        return upper

    def ancestor_at(self, node: Node, depth: int) -> Node:
        """The node on the path root..`node` whose own path is `depth` tokens long (an edge is
        split there when it crosses `depth`): what a request reading only the head of `node`'s
        path locks. Walks parents, so it works on a detached path too."""
        path = []
        while node is not None:
            path.append(node)
            node = node.parent
        start = 0
        for n in reversed(path[:-1]):  # root first, the root itself left out
            end = start + len(n.tokens)
            if end >= depth:
                return n if end == depth else self._split(n, depth - start)
            start = end
        raise ValueError(f"a path of {start} tokens has no node at depth {depth}")

    # ---------------------------------------------------------------- locks and eviction

    def lock(self, node: Node) -> None:
        while node is not None:
            if node.lock_ref == 0 and not node.detached:
                self.evictable -= node.slots.numel()
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                if node.detached:
                    self.free_slots(node.slots)
                else:
                    self.evictable += node.slots.numel()
            node = node.parent

    def unlocked_on_path(self, node: Node) -> int:
        """Evictable slots that locking `node` would take out of the free room."""
        n = 0
        while node is not None:
            if node.lock_ref == 0:
                n += node.slots.numel()
            node = node.parent
        return n

    def evict(self, n: int) -> int:
        """Free at least n slots from unlocked leaves, least recently used first (fewer when not
        that many are evictable); returns how many were freed."""
        heap = [(x.last_access, id(x), x) for x in _descendants(self.root)
                if not x.children and x.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < n:
            _, _, leaf = heapq.heappop(heap)
            freed += self._drop(leaf)
            parent = leaf.parent
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    def _drop(self, leaf: Node) -> int:
        del leaf.parent.children[leaf.tokens[0]]
        n = leaf.slots.numel()
        self.free_slots(leaf.slots)
        self.cached_tokens -= n
        self.evictable -= n
        return n

    def nodes(self):
        """Every node of the tree but the root (the ownership check walks them)."""
        return _descendants(self.root)

    def stats(self) -> dict:
        return {"cached_tokens": self.cached_tokens, "evictable_tokens": self.evictable,
                "hit_tokens": self.hit_tokens}


def _common(edge: list[int], tokens: list[int], start: int) -> int:
    """Length of the common head of `edge` and tokens[start:] (a whole-slice compare first: the
    usual full match of a long prompt edge then costs no Python loop)."""
    n = min(len(edge), len(tokens) - start)
    if edge[:n] == tokens[start:start + n]:
        return n
    for j in range(n):
        if edge[j] != tokens[start + j]:
            return j
    return n


def _descendants(root: Node):
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        yield node
