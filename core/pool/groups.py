"""The layer groups of a hybrid pool: what each kind of layer must keep of a sequence, block by block.

A model's layers fall into KV cache groups (vLLM v1's hybrid KV cache manager). One physical pool of
blocks of B token slots; a sequence holds one block table per group. What a group's table holds after
`computed` tokens are written and the table grows to `n` tokens (the next tokens are being computed):

    kind      holds                                        frees blocks before logical block
    full      every token                                  0
    sliding   the last W tokens                            max(0, computed − W + 1) // B
    chunked   the current chunk of C tokens                (computed // C) · C // B
    state     the recurrent state (Mamba, linear attention), one page a block boundary:
                mode none   the running state only (1)     (n − 1) // B (the one page, updated in place)
                mode align  the page resumed from, the     r = (computed − 1) // B; when the step jumps over a
                            step's last page (<= 2)        page (l = (n − 1) // B > r + 1) or computed = 0: l,
                                                           or n // B − 1 when n ends mid-block past B
                mode all    every page from the one        max(0, computed − 1) // B
                            resumed from (no hole)
              vLLM v1's MambaManager: get_num_skipped_tokens(c) = c − 1, so remove_skipped_blocks frees, at each
              step, every page before the one holding the state after the last computed token (r); mode all then
              allocates a page for every block to the step's end (a state saved at every boundary), mode align
              only the step's last page l (allocate_new_blocks puts null blocks in the entries between) and frees
              r at the next step (last_state_block_idx). align: a step that crosses into the next page holds r
              and l; one that jumps over pages (a prefill chunk of many blocks) takes only l, the entries between
              NULL, and holds r past its table until the sequence's next step or release (HybridLayout._resume,
              a hit's page too); the move is reported as a copy (r, l) (weighted.state_jump). A jump that ends
              mid-block past a boundary (a caller that does not split as vLLM's scheduler does,
              _mamba_block_aligned_split: verify's executor, share's scenarios, sim without prefix keys) holds
              that boundary's page and l and lets r go: what vLLM holds after the two steps its split makes of it
              (a state saved at the boundary), the chunk counted as one step.
              none: vLLM's Mamba block is then max_model_len tokens, one page a request for
              its whole life; the pool moves that page to the table's last entry as the sequence grows
              (state_pages.roll_page), no copy. Freed pages keep their hashes: cached and free, a later prompt
              still hits them (group_hits)

Freed table entries are NULL_BLOCK (block_pool). A freed block with a content hash stays in the prefix
cache's LRU and can serve a later hit until it is evicted.

    position:      0 ........ 15|16 ....... 31|32 ....... 47|48 .. 52        B = 16, W = 20, n = 53
    full table:   [    7     ] [    2      ] [    9      ] [  4  ]
    sliding:      [  NULL    ] [  NULL     ] [    9      ] [  4  ]  the token at 52 reads 33..52

A state page holds a sequence's recurrent state as it stood after the last token of its block; its
`fill` counts those tokens, so the same counts and invariants hold for every group (usage counts the page
whole: a state, not token slots; state_pages.state_slack). A prefix-cache hit of
a state group is a page saved at exactly that boundary; mode none saves none, so a Mamba hybrid then has no
prefix-cache hits at all (as vLLM). Mode all saves one at every boundary, mode align one where a step ends
(page n // B − 1 after a step to n tokens): a hit needs only the page at its boundary (vLLM's MambaManager
find_longest_cache_hit; the older pages are freed, cached), anchored to the full group's block there (group_hits);
so is a sliding group's window and a chunked group's current chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..blocks import ceil_div
from ..errors import ParameterError
from ..model.kv_groups import KVLayout

GROUP_KINDS = ("full", "sliding", "chunked", "state")
STATE_MODES = ("none", "align", "all")  # vLLM's mamba_cache_mode
DEFAULT_STATE_MODE = "align"


def check_state_mode_given(mode: str) -> None:
    """A mamba_cache_mode the hybrid pool runs: none, align or all (all: the layout aligns the block to the Mamba
    kernel's chunk, kv_groups.state_chunk, which refuses a model without one)."""
    check_state_mode(mode)


def check_state_mode(mode: str) -> str:
    mode = mode.strip().lower()
    if mode not in STATE_MODES:
        raise ParameterError(f"mamba_cache_mode {mode!r}: choose one of {', '.join(STATE_MODES)}",
                             "mamba_cache_mode")
    return mode


@dataclass(frozen=True)
class PoolGroup:
    """One KV cache group of a hybrid pool. `window`: W (sliding) or C (chunked). `label` names its layers
    for reports (e.g. "sliding 1,024 · 52 layers")."""

    kind: str
    window: int | None = None
    label: str = ""
    block_tokens: int | None = None  # tokens per block of this group's tables; None: the pool's block size
    weight: int = 1  # units of the pool one block of this group costs (weighted tables: core/pool/weighted.py)

    def tokens_per_block(self, block_size: int) -> int:
        """Tokens one block of this group's tables holds in a pool of `block_size` (the hash block)."""
        return block_size if self.block_tokens is None else self.block_tokens

    def __post_init__(self) -> None:
        if self.kind not in GROUP_KINDS:
            raise ValueError(f"unknown pool group kind {self.kind!r}: choose one of {', '.join(GROUP_KINDS)}")
        if (self.kind in ("sliding", "chunked")) != (self.window is not None):
            raise ValueError(f"a {self.kind} group {'needs' if self.window is None else 'takes no'} window")
        if self.window is not None and self.window < 1:
            raise ValueError(f"a {self.kind} group needs a positive window, got {self.window}")
        if self.block_tokens is not None and self.block_tokens < 1:
            raise ValueError(f"a group's blocks hold a positive number of tokens, got {self.block_tokens}")
        if self.weight < 1:
            raise ValueError(f"a group's block costs a positive number of units, got {self.weight}")

    @property
    def name(self) -> str:
        return self.label or (self.kind if self.window is None else f"{self.kind} {self.window:,}")

    @property
    def span(self) -> int:
        """The window as an int: W of a sliding group, C of a chunked one; a group of another kind has none."""
        if self.window is None:
            raise ValueError(f"a {self.kind} group has no window")
        return self.window

    def first_block(self, computed: int, num_tokens: int, block_size: int, state_mode: str) -> int:
        """The first logical block the table must hold while a step computes tokens `computed`..num_tokens − 1
        (see the module docstring); blocks before it can be freed. A state group keeps the page the step
        resumes from (the state after token computed − 1) until the step has run; where (align) the step jumps
        over pages the table holds only its last page, and the pool the one resumed from past it."""
        B = block_size
        if self.kind == "sliding":
            return max(0, computed - self.span + 1) // B
        if self.kind == "chunked":
            return computed // self.span * self.span // B
        if self.kind == "state" and state_mode == "none":  # the one page, where the step's last token is
            return max(0, num_tokens - 1) // B
        if self.kind == "state" and state_mode == "align":  # the page resumed from and the step's last page
            last = max(0, num_tokens - 1) // B
            if computed and last <= (computed - 1) // B + 1:  # no page jumped over: the one resumed from on
                return (computed - 1) // B
            # nothing to resume from, or a jump: the step's last page (vLLM: null blocks before it), and where the
            # step ends past a boundary mid-block the page saved there, as vLLM's aligned split ends a step on it
            return num_tokens // B - 1 if num_tokens % B and num_tokens > B else last
        if self.kind == "state" and state_mode == "all":  # every page from the one resumed from
            return max(0, computed - 1) // B
        return 0

    def first_block_before_growth(self, computed: int, block_size: int, state_mode: str) -> int:
        """Blocks freed before an append of tokens from `computed` on (so that it can reuse them)."""
        return self.first_block(computed, computed, block_size, state_mode)

    def held_blocks(self, num_tokens: int, block_size: int, state_mode: str) -> int:
        """Blocks a sequence decoding its token num_tokens − 1 holds in this group (computed = num_tokens − 1):
        the closed form of what the pool does, for plans and checks. A state page crossing into a new block
        holds the old page too for that step (align, all); mode none holds one page."""
        if num_tokens <= 0:
            return 0
        total = ceil_div(num_tokens, block_size)
        return total - min(self.first_block(num_tokens - 1, num_tokens, block_size, state_mode), total)


FULL = PoolGroup("full")


MAX_POOL_GROUPS = 256  # block tables per sequence a hybrid pool keeps


def pool_groups(layout: KVLayout, weighted: bool = False) -> tuple[PoolGroup, ...] | None:
    """The pool groups of a layout (core/model/kv_groups.py): one per block table, so a layer type that spans
    k of vLLM's groups (or takes k pages of the ideal layout's unit) is k groups alike. None for one table of
    full attention (a plain BlockPool). Where vLLM's unified pages give the types different tokens per block
    (Gemma-4, MiMo-V2-Flash: a page is 16 tokens of one type, 32 of another), each group says its own
    `block_tokens`; the pool then hashes blocks of `layout.block_size` (their gcd) and aligns hits to the lcm.
    `weighted` (a caller whose pool runs weighted tables, core/pool/weighted.py): an ideal layout of more than
    MAX_POOL_GROUPS unit tables is one table per type instead, its block `weight` = the type's units."""
    if len(layout.groups) == 1 and layout.groups[0].kind == "full" and layout.groups[0].pages_per_block == 1:
        return None
    mixed = any(g.block_tokens != layout.block_size for g in layout.groups)
    if mixed and layout.state_groups:
        # NOTE: vLLM runs this too; the pool's mixed block sizes anchor windows and chunks to the full group, not
        # yet a state page saved at a step end (align), so a Mamba hybrid whose attention types' pages differ is refused
        g = next(g for g in layout.groups if g.block_tokens != layout.block_size)
        raise ParameterError(
            f"{layout.layout} layout: vLLM unifies the page sizes, so the {g.kind} layers' blocks hold "
            f"{g.block_tokens:,} tokens and the others' {layout.block_size:,}; with a recurrent state as well kvcalc's "
            "pool does not page that yet: use layout ideal (each type its own page, the block as given)", "layout")
    labels = [f"{g.kind}{'' if g.window is None else f' {g.window:,}'} ({g.source}, {g.layers} layers)"
              for g in layout.groups]
    groups: list[PoolGroup] = []
    for g, label in zip(layout.groups, labels, strict=True):
        groups += [PoolGroup(g.kind, g.window, label, g.block_tokens if mixed else None)] * g.pages_per_block
    if len(groups) > MAX_POOL_GROUPS and weighted and layout.layout == "ideal":  # no padding, no mixed tokens
        return tuple(PoolGroup(g.kind, g.window, label, None, g.pages_per_block)
                     for g, label in zip(layout.groups, labels, strict=True))
    if len(groups) > MAX_POOL_GROUPS:
        # NOTE: the ideal layout counts memory in the gcd of the types' block bytes; a state of millions of bytes
        # against an attention block of a power of two is then thousands of units, each its own table here
        big = max(layout.groups, key=lambda g: g.pages_per_block)
        raise ParameterError(
            f"layout {layout.layout}: the unit that tiles every type's block is {layout.page_bytes:,} B (their "
            f"gcd), so the {big.kind} block ({big.block_bytes:,} B) is {big.pages_per_block:,} units and a sequence "
            f"holds {len(groups):,} block tables, above the pool's {MAX_POOL_GROUPS} (a table per unit); share runs "
            "it on weighted tables, this command not yet: use layout vllm", "layout")
    return tuple(groups)


def weighted_layout(layout: KVLayout) -> bool:
    """The layout's pool runs weighted tables (pool_groups(layout, weighted=True): one table a type)."""
    return layout.layout == "ideal" and sum(g.pages_per_block for g in layout.groups) > MAX_POOL_GROUPS


def pool_ids(layout: KVLayout, units: int) -> int:
    """Block ids (per-block array entries) a pool of `units` of the layout allocates: the units themselves, or on
    weighted tables each type's units // its weight (weighted.WeightedStore)."""
    return sum(units // g.pages_per_block for g in layout.groups) if weighted_layout(layout) else units


def peak_blocks(groups: tuple[PoolGroup, ...], num_tokens: int, block_size: int, state_mode: str,
                chunk_tokens: int) -> int:
    """The most blocks one sequence of `num_tokens` holds at once when its prompt is computed in chunks of at
    most `chunk_tokens` T: full ceil(n / B); sliding a window and a chunk, ceil((W − 1 + T) / B) + 1; chunked
    ceil((C + T) / B) + 1; a state group (PoolGroup.first_block): none one page (vLLM's one page a request,
    updated in place); align 2, the page a step resumes from and its last (vLLM's MambaSpec.max_memory_usage_bytes,
    2 pages); all the pages from the one a
    step resumes from to its last, (n − 1) // B − (c − 1) // B + 1 <= ceil(T / B) + 1 for a step c -> n of at
    most T tokens (ceil(n / B) <= ceil(T / B) from c = 0). Each capped at ceil(n / B). A block of a weighted
    table counts its weight (units of the pool)."""
    n, T = num_tokens, chunk_tokens
    blocks = 0
    for g in groups:
        B = g.tokens_per_block(block_size)  # a group's own tokens per block (mixed under vLLM's unified pages)
        all_blocks = ceil_div(n, B)
        if g.kind == "full":
            held = all_blocks
        elif g.kind in ("sliding", "chunked"):
            reach = g.span - 1 + T if g.kind == "sliding" else g.span + T
            held = min(all_blocks, ceil_div(reach, B) + 1)
        elif state_mode == "none":  # the one page, weighted or not (state_pages.roll_page)
            held = min(all_blocks, 1)
        elif state_mode == "align":  # the page resumed from and the step's last (a jump: the last only)
            held = min(all_blocks, 2)
        else:  # all: from the page resumed from to the step's last
            held = min(all_blocks, ceil_div(T, B) + 1)
        blocks += held * g.weight
    return blocks
