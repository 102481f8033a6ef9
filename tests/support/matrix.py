"""The combination matrix (issue 29): every recipe crossed with the options users combine, on each path it runs.

One table, read by the matrix tests (``tests/integration/test_matrix_pack.py`` for the pack's own sampler,
``tests/integration/test_matrix_core_ar.py`` for ComfyUI core's ``sample_ar_video``) and printed by
``python tests/support/matrix.py`` (a Markdown table per path). A cell is one of:

- **runs**: the test runs the recipe with that option and checks it against an independent computation
  (:data:`CHECKS` says which, per column; :data:`CHECK_OVERRIDES` where a recipe needs another one);
- **refused**: the run must stop with the error the recipe owns (the regex in :data:`REFUSED`);
- **not on this path**: the option (or the recipe) does not exist there (:data:`ABSENT`, with the reason).

Adding a row: a :class:`Recipe` in :data:`RECIPES` (its request options, ``paths`` where it runs); then every
column of each of its paths runs unless :data:`REFUSED` / :data:`ABSENT` say otherwise, and the test modules
need the recipe's options (``recipe_options`` there) and, where its cache is not written like the plain
recipe's, a reference for it. Adding a column: an entry in :data:`COLUMNS` and :data:`CHECKS`, and one test
function per path module that takes the cells of that column (``cells(path, column)``). No ComfyUI import here.
"""

from __future__ import annotations

from dataclasses import dataclass

PATHS = {
    "pack": "the pack's Chunked AR Video Sampler (runtime.chunk_loop.run_chunked_ar)",
    "core": "ComfyUI core's SamplerARVideo (sample_ar_video, v0.27+) on a causal Wan with the pack's cache",
}


@dataclass(frozen=True)
class Recipe:
    name: str
    what: str
    paths: tuple[str, ...]


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "plain",
            "euler, 2 simple steps, clean relabelled cache writes (core: one step from sigma 1)",
            ("pack", "core"),
        ),
        Recipe(
            "self_forcing",
            "Self-Forcing's 4-step schedule, LCM (fresh noise every step; core: its own re-noising)",
            ("pack", "core"),
        ),
        Recipe("causvid", "CausVid's 3-step schedule, LCM", ("pack",)),
        Recipe("longlive", "LongLive's 4-step schedule and its re-cache on a prompt switch", ("pack",)),
        Recipe("krea", "Krea Realtime: cache recomputed from the last 2 frames, attention bias 0.5, a VAE", ("pack",)),
        Recipe("skyreels", "SkyReels-V2 DF context noise 0.1, redrawn every step", ("pack",)),
        Recipe("causal_forcing", "Causal Forcing++ frame-wise 2-step, the first chunk on its 4-step list", ("pack",)),
        Recipe("first_frame_apart", "an independent first frame: chunks of 1, 2, 2, ... latent frames", ("pack",)),
    )
}

COLUMNS: dict[str, str] = {
    "prefix": "extend a prefix clip (a prompt schedule switching inside the clip)",
    "resume": "continue a saved KV cache (saved to a file and loaded back)",
    "batch2": "a batch of 2 videos",
    "cfg": "cfg 3: cond and uncond branches",
    "tiers": "age tiers per side: keys 2/8/8, values 2/4/8 (old / newest / sink), Hadamard, window 2 + sink 1",
    "qvg": "QVG (k-means centroids + an RTN residual) on both sides",
    "window_sink": "a window of 2 chunks and a sink of 1 (full precision)",
    "odd_tokens": "a 6 x 10 latent: 15 tokens per frame, 30 per chunk (no power of two)",
    "odd_size": "a 7 x 10 latent (odd height: not whole 2 x 2 patches)",
    "prompt_switch": "a prompt switch at chunk 4 under window 2 + sink 1 (and the same, resumed at chunk 3)",
}

CHECKS: dict[str, str] = {
    "prefix": "one run == the clip (its first 2 chunks) + the extension, bit for bit (INT2, Hadamard, Taylor)",
    "resume": "one run == the first 2 chunks + save/load + the rest, bit for bit (INT2, Hadamard, Taylor)",
    "batch2": "each item == the batch-1 run of its batch_index (1e-5; INT2)",
    "cfg": "cond and uncond as separate model calls (low memory) == batched in one call (1e-5; INT2)",
    "tiers": (
        "bits of every held chunk per side == the tiers' positions == the planner's; cache bytes == planner bytes "
        "per side; the newest chunk == its raw K/V quantized at its bits, bit for bit; an aged chunk within Delta/2 "
        "of each of its stored forms (rotated space); one run == 2 chunks saved with their tiers + load + the rest"
    ),
    "qvg": "cache bytes == planner bytes; the newest chunk's reconstruction within its residual's Delta/2",
    "window_sink": "every model call of the last chunk == a float32 masked forward over the chunks the rule keeps",
    "odd_tokens": "as window_sink without a window (15 tokens per frame); INT2 cache bytes == planner bytes",
    "odd_size": "refused by the Wan family",
    "prompt_switch": (
        "(the pack's causal re-cache; LongLive's, the default, in the longlive row) "
        "the calls after the switch == a masked forward over the chunks re-cached under the new prompt; the run "
        "resumed from a state saved at chunk 3 (one chunk before the switch) == the one run, bit for bit"
    ),
}

#: what the core path's plain row (one step from sigma 1) adds to its checks
CROSS = "; one step == the pack's own loop given the same noise (both must store and read the same chunks)"

#: recipe-specific checks where the column's default does not apply (what the recipe's reference says instead)
CHECK_OVERRIDES: dict[tuple[str, str, str], str] = {
    ("pack", "causal_forcing", "prefix"): (
        "the first chunk after the clip takes the first-chunk list (t = 1000, 937.5, 833.3, 625), later chunks "
        "the 2-step list (t = 1000, 833.3): Causal Forcing's reference timesteps"
    ),
    **{
        ("pack", r, "batch2"): "as batch2, with euler: ComfyUI's LCM draws its step noise for the whole batch"
        for r in ("self_forcing", "causvid", "longlive", "causal_forcing")
    },
    ("pack", "longlive", "prompt_switch"): (
        "the calls after the switch == a masked forward over LongLive's re-computed chunks (sink, the evicted chunk "
        "and the window in one forward, no mask); no resumed run: a saved state does not keep the evicted chunk"
    ),
    ("pack", "krea", "tiers"): "as tiers, without window and sink (recompute refuses them): the recent tier "
    "only; no resume (refused)",
    ("pack", "krea", "prompt_switch"): "the context of the chunk after the switch is written under the new prompt "
    "and its calls == scope's masked forward with the bias (no window: recompute refuses it)",
    **{
        (("core", r, c)): text + (CROSS if r == "plain" and c not in ("prefix", "batch2") else "")
        for r in ("plain", "self_forcing")
        for c, text in {
            "prefix": "ARVideoI2V's initial latent (one block): quantization off == core's own run (2e-5); INT2: "
            "cache bytes == planner bytes",
            "batch2": "each item (self_forcing: item 0; core redraws step noise for the whole batch) == the batch-1 "
            "run of its batch_index (INT2)",
            "cfg": "INT2: cond and uncond as separate calls == batched (core's own sampler cannot batch the branches "
            "over its caches, so no core reference)",
            "tiers": "chunks demoted == a plain count of the chunks that left the recent tier; cache bytes == planner "
            "bytes; the block in flight == the planner's (and for a values-only tier)",
            "qvg": "cache bytes == planner bytes; the block in flight waits in the model's dtype, as planned",
            "window_sink": "AR Cache Window: the cache holds sink + window chunks, the planner's bytes (INT2)",
            "odd_tokens": "quantization off == core's own run (2e-5); INT2 cache bytes == planner bytes",
        }.items()
    },
}

#: (path, recipe, column) -> the error the run must stop with (a regex of the recipe's own message)
REFUSED: dict[tuple[str, str, str], str] = {
    ("pack", "krea", "resume"): "cannot be combined with .*(a kv_cache to continue|the kv_cache output)",
    ("pack", "krea", "window_sink"): "cannot be combined with window_chunks=2, sink_chunks=1",
    **{
        (path, r, "odd_size"): r"latent height 7 and width 10 must be even \(Wan patches 2x2\)"
        for r, rec in RECIPES.items()
        for path in rec.paths
    },
}

#: (path, recipe or "*", column or "*") -> why that cell does not exist
ABSENT: dict[tuple[str, str, str], str] = {
    ("core", "*", "resume"): "core's SamplerARVideo has no KV cache input or output",
    ("core", "*", "prompt_switch"): "core's sampler takes one positive conditioning (schedules are the pack's)",
}


@dataclass(frozen=True)
class Cell:
    path: str
    recipe: str
    column: str
    status: str  # "runs", "refused" or "absent"
    detail: str  # the check, the refusal's regex, or why it is absent

    @property
    def id(self) -> str:
        return f"{self.recipe}-{self.column}"


def _absent(path: str, recipe: str, column: str) -> str | None:
    if path not in RECIPES[recipe].paths:
        return f"the {recipe} recipe is not an option of {PATHS[path].split(' (')[0]}"
    for key in ((path, recipe, column), (path, "*", column), (path, recipe, "*")):
        if key in ABSENT:
            return ABSENT[key]
    return None


def cell(path: str, recipe: str, column: str) -> Cell:
    why = _absent(path, recipe, column)
    if why is not None:
        return Cell(path, recipe, column, "absent", why)
    if (path, recipe, column) in REFUSED:
        return Cell(path, recipe, column, "refused", REFUSED[(path, recipe, column)])
    return Cell(path, recipe, column, "runs", CHECK_OVERRIDES.get((path, recipe, column), CHECKS[column]))


def cells(path: str, column: str | None = None, status: str | None = None) -> list[Cell]:
    """The cells of ``path`` (one ``column``; one ``status``), recipes in table order."""
    out = [cell(path, r, c) for r in RECIPES for c in COLUMNS if column is None or c == column]
    return [c for c in out if status is None or c.status == status]


def render(path: str) -> str:
    """The matrix of ``path`` as Markdown: one row per recipe, one column per option."""
    short = {"runs": "runs", "refused": "refused", "absent": "-"}
    head = "| recipe | " + " | ".join(COLUMNS) + " |"
    lines = [f"### {PATHS[path]}", "", head, "|" + "---|" * (len(COLUMNS) + 1)]
    for r in RECIPES:
        if path not in RECIPES[r].paths:
            continue
        lines.append(f"| {r} | " + " | ".join(short[cell(path, r, c).status] for c in COLUMNS) + " |")
    own = [c for c in cells(path) if path in RECIPES[c.recipe].paths]
    lines += ["", f"Not on this path: {', '.join(r for r in RECIPES if path not in RECIPES[r].paths) or 'none'}."]
    lines += ["", "Refused and absent cells:", ""]
    groups: dict[tuple[str, str, str], list[str]] = {}
    for c in own:
        if c.status != "runs":
            groups.setdefault((c.column, c.status, c.detail), []).append(c.recipe)
    for (column, status, detail), recipes in groups.items():
        who = "every recipe" if len(recipes) == len({c.recipe for c in own}) else ", ".join(recipes)
        lines.append(f"- {column} ({who}): {status}: `{detail}`")
    lines += ["", "Cells with their own check:", ""]
    lines += [f"- {c.recipe} x {c.column}: {c.detail}" for c in own if (path, c.recipe, c.column) in CHECK_OVERRIDES]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ the new families (issue 43)
@dataclass(frozen=True)
class FamilyTable:
    """One family's matrix: rows (its recipes / settings) x columns (the options it accepts). Cells run unless
    ``refused`` (a regex of the error, which names the option) or ``absent`` (why it does not exist) say otherwise;
    ``checks`` says what a running cell is checked against (never the pack's own output of the same run)."""

    key: str
    path: str
    rows: dict[str, str]
    columns: dict[str, str]
    checks: dict[str, str]
    refused: dict[tuple[str, str], str]
    absent: dict[tuple[str, str], str]
    test: str

    def cell(self, row: str, column: str) -> Cell:
        for key in ((row, column), ("*", column), (row, "*")):
            if key in self.absent:
                return Cell(self.key, row, column, "absent", self.absent[key])
        if (row, column) in self.refused or ("*", column) in self.refused:
            return Cell(
                self.key, row, column, "refused", self.refused.get((row, column), self.refused.get(("*", column)))
            )
        return Cell(self.key, row, column, "runs", self.checks[column])

    def cells(self, column: str | None = None, status: str | None = None) -> list[Cell]:
        out = [self.cell(r, c) for r in self.rows for c in self.columns if column is None or c == column]
        return [c for c in out if status is None or c.status == status]

    def render(self) -> str:
        short = {"runs": "runs", "refused": "refused", "absent": "-"}
        lines = [f"### {self.path}", "", f"Tests: `{self.test}`.", "", "Rows:", ""]
        lines += [f"- **{r}**: {what}" for r, what in self.rows.items()]
        lines += ["", "Columns and the check of a running cell:", ""]
        lines += [f"- **{c}**: {what}. Check: {self.checks[c]}" for c, what in self.columns.items()]
        lines += ["", "| row | " + " | ".join(self.columns) + " |", "|" + "---|" * (len(self.columns) + 1)]
        for r in self.rows:
            lines.append(f"| {r} | " + " | ".join(short[self.cell(r, c).status] for c in self.columns) + " |")
        lines += ["", "Refused and absent cells:", ""]
        groups: dict[tuple[str, str, str], list[str]] = {}
        for c in self.cells():
            if c.status != "runs":
                groups.setdefault((c.column, c.status, c.detail), []).append(c.recipe)
        for (column, status, detail), rows in groups.items():
            who = "every row" if len(rows) == len(self.rows) else ", ".join(rows)
            lines.append(f"- {column} ({who}): {status}: `{detail}`")
        return "\n".join(lines)


#: what every running MAGI-1 / HY-WorldPlay cell checks besides its column's own check
PLAN_EQUALS_MEASURED = (
    "the planner's bytes counted by hand (held chunks by the retention rule written in the test, each at its "
    "bits) == the report's planned_bytes == ComfyUI's memory request (load_models_gpu's memory_required, "
    "recorded) == the report's measured cache_bytes"
)

MAGI1 = FamilyTable(
    key="magi1",
    path="the MAGI-1 AR Sampler (runtime.families.magi1.recipe.run), tiny MAGI-1, 5 chunks of 1 latent frame",
    rows={
        "distill_w1": "distilled, window_size 1, 8 steps, cfg_number 1",
        "distill_w2": "distilled, window_size 2, 8 steps, cfg_number 1",
        "distill_w3": "distilled, window_size 3, 12 steps (the shortcut grid), cfg_number 1",
        "distill_w4": "distilled, window_size 4, 8 steps, cfg_number 1",
        "base_w2": "base, window_size 2, 8 steps, cfg_number 3 (text, context and unconditional passes)",
    },
    columns={
        "fp": "full precision, window 0 (what the key ranges 5,4,3,2 reach)",
        "kv_ranges": "full precision, kv_ranges 3,1 (2 stages), window 0",
        "window_sink": "full precision, kv_ranges all, window 2 + sink 1",
        "prompts": "full precision, a prompt schedule switching at chunk 2",
        "rtn": "INT2 keys and values, RTN without rotation, Taylor correction at strength 1",
        "quarot": "INT2, Hadamard rotation (QuaRot), chunk_mean correction at strength 0.5",
        "qvg": "QVG on both sides, explicit K (16 centroids), exact correction",
        "qvg_auto": "QVG on both sides, auto K, per_channel correction",
        "tiers": "tiers per side: keys 2/8/8, values 2/4/8 (old / newest / sink), kv_ranges all, window 2 + sink 1",
        "odd_size": "a 7 x 8 latent (odd height)",
    },
    checks={
        "fp": "the samples == the pure sampler with the reference's whole-video float32 buffer (1e-5); "
        + PLAN_EQUALS_MEASURED,
        "kv_ranges": "the samples == the pure sampler with those ranges and the whole buffer (1e-5): the window the "
        "ranges reach evicts nothing read; " + PLAN_EQUALS_MEASURED,
        "window_sink": "the samples == the pure sampler over a float32 attention that keeps the sink and the last 2 "
        "finished chunks (the rule written in the test); " + PLAN_EQUALS_MEASURED,
        "prompts": "the samples == the pure sampler with each chunk's caption from its prompt; " + PLAN_EQUALS_MEASURED,
        "rtn": "every held chunk == its raw K/V (the writing forward's) quantized at its bits, bit for bit; "
        + PLAN_EQUALS_MEASURED,
        "quarot": "as rtn (Hadamard codes); the report's correction and strength are the ones asked",
        "qvg": "every held chunk's reconstruction within its residual's Delta/2 of its raw K/V; "
        + PLAN_EQUALS_MEASURED,
        "qvg_auto": "as qvg, at the auto K",
        "tiers": "each held chunk's bits per side == its position's by hand; never-demoted chunks == raw K/V "
        "quantized at their bits, bit for bit, demoted ones within both forms' Delta/2; " + PLAN_EQUALS_MEASURED,
        "odd_size": "refused",
    },
    refused={("*", "odd_size"): r"latent height 7 and width 8 must be even \(MAGI-1 patches 2x2\)"},
    absent={},
    test="tests/integration/test_matrix_magi1.py (the refusals of the sampler: one test each, there too)",
)


#: what every running HY-WorldPlay cell checks besides its column's own check
CONTEXT_BY_HAND = (
    "each chunk's context frames == the reference's rule written in the test (select_aligned_memory_frames: every "
    "earlier frame up to 20, then chunk 0, the last 3 chunks and the older chunk whose frames h and h + 2 overlap the "
    "new chunk's views most, over 50,000 points drawn after torch.manual_seed(the run's seed))"
)

WORLDPLAY = FamilyTable(
    key="worldplay",
    path="the HY-WorldPlay AR Sampler (runtime.families.worldplay.recipe.run), tiny HY-WorldPlay (2 double blocks x "
    "2 streams, 2 heads x 32), 7 chunks of 4 latent frames (chunk 6 selects its context)",
    rows={
        "ar_4step": "the AR distilled recipe: 4 Euler steps at shift 5 per chunk, cfg 1, the context re-encoded at t 14"
    },
    columns={
        "revisit": "a path that revisits chunk 6's view at chunk 1's third frame and chunk 2's last frame, with tiers "
        "(as the tiers column), seed 3",
        "tie": "a path where chunk 1 and chunk 2 look 20 degrees either side of chunk 6's view (their overlaps tie in "
        "expectation; the seed's points decide), full precision, seed 7",
        "fp": "full precision (no patch nodes), the tiny camera path (forward, yaw right, strafe, ...), seed 5",
        "rtn": "INT2 keys and values, RTN without rotation, Taylor correction at strength 1",
        "quarot": "INT2, Hadamard rotation (QuaRot), chunk_mean correction at strength 0.5",
        "qvg": "QVG on both sides, explicit K (16 centroids), exact correction",
        "qvg_auto": "QVG on both sides, auto K, per_channel correction",
        "tiers": "tiers per side: keys 2/8, values 2/4 (old / newest context chunk), Hadamard, Taylor",
        "odd_size": "a 5 x 7 latent (odd height and width: 35 tokens per frame), INT2 RTN, Taylor at strength 0.5",
        "window_sink": "window 2 + sink 1",
    },
    checks={
        "revisit": "as tiers; the rule takes chunk 1 (by its frame h + 2), not chunk 2 (whose h + 3 looks there)",
        "tie": "as fp; the rule at seed 7 takes chunk 1, at seed 0 chunk 2",
        "fp": "the samples == the model's own calls with the reference's full-precision memory (ContextKV) over the "
        "context chosen in the test, within float32 rounding; " + CONTEXT_BY_HAND + "; " + PLAN_EQUALS_MEASURED,
        "rtn": "every context chunk held at the last chunk == its raw K/V (the re-encode's) quantized at its bits, "
        "bit for bit, on both streams; " + CONTEXT_BY_HAND + "; " + PLAN_EQUALS_MEASURED,
        "quarot": "as rtn (Hadamard codes); the report's correction is the one asked",
        "qvg": "every held chunk's reconstruction within its residual's Delta/2 of its raw K/V; "
        + CONTEXT_BY_HAND
        + "; "
        + PLAN_EQUALS_MEASURED,
        "qvg_auto": "as qvg, at the auto K",
        "tiers": "each held chunk's bits per side == its position's by hand (the newest context chunk at 8 / 4); "
        "never-demoted chunks == raw K/V quantized at their bits, bit for bit, demoted ones within both forms' "
        "Delta/2; " + CONTEXT_BY_HAND + "; " + PLAN_EQUALS_MEASURED,
        "odd_size": "as rtn, at 35 tokens per frame",
        "window_sink": "refused",
    },
    refused={("*", "window_sink"): r"window_chunks=2, sink_chunks=1.*set both to 0"},
    absent={},
    test="tests/integration/test_matrix_worldplay.py (the refusals of the sampler: one test each, there too)",
)

RAYLIGHT = FamilyTable(
    key="raylight",
    path="Raylight's Ulysses sequence parallelism (runtime.families.wan.raylight) on core's sample_ar_video, tiny "
    "causal Wan, two gloo CPU ranks against one process holding every head",
    rows={"heads4": "4 heads over Ulysses 2: each rank holds 2 heads (rank 1: global heads 2 and 3)"},
    columns={
        "rtn": "INT2 RTN without rotation, Taylor, 16 tokens per frame (no padding), 4 frames",
        "quarot": "INT2 Hadamard, Taylor, age tiers, window 2 + sink 1, 9 tokens per frame (Raylight pads to 10)",
        "chunk_mean": "as quarot, chunk_mean",
        "exact": "as quarot, exact",
        "per_channel": "as quarot, per_channel",
        "off": "as quarot, no correction",
        "qvg": "QVG, explicit K (4 centroids), Taylor, 9 tokens per frame",
        "qvg_auto": "QVG, auto K, Taylor, 9 tokens per frame",
        "no_layout": "INT2 Hadamard, Taylor at group 8, where no Taylor layout passes its check on rank 0",
        "pad_rank": "a shard padded by a whole rank's tokens (the block's usp_ar_block_seq_len one rank count short)",
    },
    checks={
        "rtn": "each rank's video == the one-process float32 run over every head (5e-6); rank 0 == rank 1; each rank "
        "holds half the one-process bytes, reports 2 heads from global head 2 x rank",
        "quarot": "as rtn (the Hadamard signs per global head)",
        "chunk_mean": "as rtn",
        "exact": "as rtn",
        "per_channel": "as rtn",
        "off": "as rtn",
        "qvg": "as rtn within 2e-4 (its k-means and guard run batched over a process's heads: another rounding order; "
        "its centroids seeded per global head)",
        "qvg_auto": "as qvg",
        "no_layout": "as rtn; and every rank's Taylor layout is rank 0's: none (one buffer)",
        "pad_rank": "refused",
    },
    refused={("*", "pad_rank"): r"not the block's \d+ tokens \(usp_ar_block_seq_len\) padded to a multiple of 2"},
    absent={},
    test="tests/integration/test_matrix_raylight.py",
)

FAMILIES: dict[str, FamilyTable] = {t.key: t for t in (MAGI1, WORLDPLAY, RAYLIGHT)}


def render_all() -> str:
    rows = ["## Rows (recipes)", ""] + [f"- **{r.name}**: {r.what}" for r in RECIPES.values()]
    cols = ["", "## Columns (options) and the check of a running cell", ""]
    cols += [f"- **{c}**: {what}. Check: {CHECKS[c]}" for c, what in COLUMNS.items()]
    fams = ["", "## The new families (issue 43)", ""] + [f.render() + "\n" for f in FAMILIES.values()]
    return "\n".join(rows + cols + ["", render("pack"), "", render("core")] + fams)


if __name__ == "__main__":
    print(render_all())
