"""`spinkv eval`: KV presets against the fp16 cache on real text (tables or --json)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from spinkv.cli import options as opt
from spinkv.cli.render import print_note, progress_bar, stderr, stdout
from spinkv.errors import InvalidInputError
from spinkv.eval import passkey
from spinkv.eval import runner as ev
from spinkv.eval import stats as eval_stats
from spinkv.eval.arms import parse_arms

EVAL = "Evaluation"
DEFAULT_DEPTHS_TEXT = ",".join(map(str, passkey.DEFAULT_DEPTHS))


OnlyOption = Annotated[
    Optional[str],
    typer.Option(
        "--only",
        help="Parts to run: kld,greedy,passkey (with --suite: corpus,tasks).",
        show_default=False,
        rich_help_panel=EVAL,
    ),
]
PlotOption = Annotated[
    Optional[Path],
    typer.Option(
        "--plot",
        help="Write KLD against depth as a PNG (with --suite: a directory of PNGs).",
        show_default=False,
        rich_help_panel=opt.OUTPUT,
    ),
]


def _int_list(value: str, what: str) -> tuple[int, ...]:
    try:
        items = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError as exc:
        raise InvalidInputError(f"{what} must be comma-separated integers, got {value!r}") from exc
    if not items or any(x <= 0 for x in items):
        raise InvalidInputError(f"{what} must be positive integers, got {value!r}")
    return items


def select_parts(only: str | None, *, kld: bool, greedy: bool, retrieval: bool) -> tuple[str, ...]:
    """The parts to run: --only's list, else every part not switched off."""
    if only:
        parts = tuple(p.strip() for p in only.split(",") if p.strip())
        unknown = [p for p in parts if p not in ev.PARTS]
        if unknown or not parts:
            raise InvalidInputError(
                f"--only {only!r}: choose from {', '.join(ev.PARTS)} (comma separated)"
            )
        return parts
    wanted = {"kld": kld, "greedy": greedy, "passkey": retrieval}
    parts = tuple(p for p in ev.PARTS if wanted[p])
    if not parts:
        raise InvalidInputError("every part is switched off: nothing to evaluate")
    return parts


TokensOption = Annotated[
    Optional[int],
    typer.Option(
        "--tokens",
        "--n",
        help=f"Tokens of text (BOS first) [default: {ev.DEFAULT_TOKENS}; with --suite the tier's].",
        show_default=False,
        rich_help_panel=EVAL,
    ),
]
SeedOption = Annotated[
    Optional[int],
    typer.Option(
        "--bootstrap-seed",
        help=f"Seed of the bootstrap and the pass keys [default: {eval_stats.DEFAULT_SEED}; "
        "with --suite the preregistered seed, which also picks the prompts].",
        show_default=False,
        rich_help_panel=EVAL,
    ),
]
SuiteOption = Annotated[
    Optional[str],
    typer.Option(
        "--suite",
        help="Run the preregistered evaluation suite instead: quick (tests, CI) or full "
        "(the resolving figures). Corpus KLD on real texts, task families, SHIP / NO-SHIP.",
        show_default=False,
        rich_help_panel=EVAL,
    ),
]
PreregOption = Annotated[
    Optional[Path],
    typer.Option(
        "--prereg",
        help="Preregistration file for --suite (default: the one shipped with spinkv).",
        show_default=False,
        rich_help_panel=EVAL,
    ),
]

MergeOption = Annotated[
    Optional[str],
    typer.Option(
        "--merge",
        help="With --suite: combine the JSON records of runs of separate parts "
        "(FILE,FILE) and decide again, without running the model.",
        show_default=False,
        rich_help_panel=EVAL,
    ),
]
FamiliesOption = Annotated[
    Optional[str],
    typer.Option(
        "--families",
        help="With --suite: only these task families (comma separated; merge the records "
        "of the others with --merge before deciding).",
        show_default=False,
        rich_help_panel=EVAL,
    ),
]
TextsOption = Annotated[
    Optional[str],
    typer.Option(
        "--texts",
        help="With --suite: only these corpus texts (comma separated; merge the records of "
        "the others with --merge before deciding).",
        show_default=False,
        rich_help_panel=EVAL,
    ),
]


def eval_command(
    model: opt.ModelOption = None,
    threads: opt.ThreadsOption = None,
    kv: Annotated[
        str,
        typer.Option(
            "--kv",
            help="KV arms to compare with fp16, comma separated: fp16, turbo, turbo-qjl, kivi2, "
            "kivi4; per-arm settings as preset:key=value (e.g. turbo:window=0:sink_tokens=4).",
            rich_help_panel=opt.KV_CACHE,
        ),
    ] = "turbo",
    k_bits: opt.KBitsOption = None,
    v_bits: opt.VBitsOption = None,
    kv_window: opt.KvWindowOption = None,
    kv_page: opt.KvPageOption = None,
    sink_tokens: opt.SinkTokensOption = None,
    sparse_v: opt.SparseVOption = None,
    text: Annotated[
        Path,
        typer.Option(
            "--text", help="UTF-8 text for the teacher-forced part.", rich_help_panel=EVAL
        ),
    ] = ev.DEFAULT_TEXT,
    n: TokensOption = None,
    skip: Annotated[
        int,
        typer.Option("--skip", help="Positions left out of the summaries.", rich_help_panel=EVAL),
    ] = ev.DEFAULT_SKIP,
    only: OnlyOption = None,
    no_greedy: Annotated[
        bool, typer.Option("--no-greedy", help="Skip greedy agreement.", rich_help_panel=EVAL)
    ] = False,
    no_passkey: Annotated[
        bool, typer.Option("--no-passkey", help="Skip passkey retrieval.", rich_help_panel=EVAL)
    ] = False,
    gen: Annotated[
        int,
        typer.Option("--gen", help="Greedy tokens per chat prompt.", rich_help_panel=EVAL),
    ] = ev.DEFAULT_GEN_TOKENS,
    passkey_depths: Annotated[
        str,
        typer.Option(
            "--passkey-depths", help="Passkey prompt lengths in tokens.", rich_help_panel=EVAL
        ),
    ] = DEFAULT_DEPTHS_TEXT,
    passkey_position: Annotated[
        float,
        typer.Option(
            "--passkey-position", help="Relative position of the key (0..1).", rich_help_panel=EVAL
        ),
    ] = passkey.DEFAULT_POSITION,
    resamples: Annotated[
        int, typer.Option("--resamples", help="Bootstrap resamples.", rich_help_panel=EVAL)
    ] = eval_stats.DEFAULT_RESAMPLES,
    seed: SeedOption = None,
    plot: PlotOption = None,
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Print the full record as JSON.", rich_help_panel=opt.OUTPUT),
    ] = False,
    suite: SuiteOption = None,
    prereg: PreregOption = None,
    merge: MergeOption = None,
    families: FamiliesOption = None,
    texts: TextsOption = None,
) -> None:
    """Compare KV cache presets with the fp16 cache on real text.

    Teacher-forced KLD / top-1 / perplexity as decode sees it, greedy agreement on chat
    prompts, passkey retrieval; or, with --suite, the preregistered evaluation suite."""
    overrides = {
        "k_bits": k_bits,
        "v_bits": v_bits,
        "window": kv_window,
        "page_tokens": kv_page,
        "sink_tokens": sink_tokens,
        "sparse_v": sparse_v,
    }
    if suite is not None:
        from spinkv.eval.suite_command import run_suite

        run_suite(
            model=model,
            threads=threads,
            arms=parse_arms(kv, overrides),
            tier=suite,
            prereg=prereg,
            only=only,
            tokens=n,
            seed=seed,
            plot=plot,
            json_output=json_output,
            merge=merge,
            families=families,
            texts=texts,
        )
        return
    if prereg is not None or merge is not None or families is not None or texts is not None:
        raise InvalidInputError("--prereg, --merge, --families and --texts need --suite")
    n = ev.DEFAULT_TOKENS if n is None else n
    seed = eval_stats.DEFAULT_SEED if seed is None else seed
    parts = select_parts(only, kld=True, greedy=not no_greedy, retrieval=not no_passkey)
    settings = ev.EvalSettings(
        arms=parse_arms(kv, overrides),
        text=text,
        n_tokens=n,
        skip=skip,
        parts=parts,
        gen_tokens=gen,
        passkey_depths=_int_list(passkey_depths, "--passkey-depths"),
        passkey_position=passkey_position,
        resamples=resamples,
        seed=seed,
    )
    settings.validate()
    if plot is not None:
        from spinkv.eval.plot import plot_path

        plot = plot_path(plot)
        if "kld" not in parts:
            raise InvalidInputError("--plot needs the kld part")
    if "kld" in parts and not text.is_file():
        raise InvalidInputError(f"no such text file: {text}")

    import spinkv.api as api

    loaded = api.load(model, threads=threads)
    with progress_bar(stderr) as progress:
        record = ev.evaluate(loaded, settings, progress)
    if plot is not None:
        from spinkv.eval.plot import plot_depth

        plot_depth(record, plot)
        print_note(f"wrote {plot}")
    if json_output:
        sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
        return
    for table in eval_tables(record):
        stdout.print(table)
        stdout.print()


# ---- tables ----------------------------------------------------------------------------


def _ci(fig: Mapping[str, float], fmt: str, scale: float = 1.0) -> str:
    v, lo, hi = (fig[k] * scale for k in ("value", "lo", "hi"))
    return f"{v:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def kld_table(kld: Mapping[str, Any]) -> Table:
    ref = kld["reference"]["ppl"]
    title = (
        f"teacher-forced vs fp16: {kld['positions']} positions of {Path(kld['text']).name} "
        f"(>= {kld['skip']}), fp16 ppl {_ci(ref, '.3f')}; 95% paired bootstrap CI"
    )
    table = Table(title=title, title_justify="left", show_edge=False)
    for name in ("arm", "KLD mean", "KLD p99", "top-1 %", "ppl", "Δppl %", "bits/ch"):
        table.add_column(name, justify="left" if name == "arm" else "right", overflow="fold")
    for arm in kld["arms"]:
        bits = arm["cache"].get("bits_per_channel")
        table.add_row(
            arm["label"],
            _ci(arm["kld_mean"], ".4f"),
            _ci(arm["kld_p99"], ".3f"),
            _ci(arm["top1"], ".1f", 100.0),
            _ci(arm["ppl"], ".3f"),
            _ci(arm["ppl_delta_pct"], "+.2f"),
            "-" if bits is None else f"{bits:.2f}",
        )
    return table


def greedy_table(greedy: Mapping[str, Any]) -> Table:
    n_prompts = len(greedy["prompts"])
    title = (
        f"greedy agreement with fp16: {n_prompts} chat prompts, up to {greedy['gen_tokens']} tokens"
    )
    table = Table(title=title, title_justify="left", show_edge=False)
    table.add_column("arm", overflow="fold")
    table.add_column("tokens to 1st divergence (mean)", justify="right", overflow="fold")
    table.add_column("min", justify="right", overflow="fold")
    table.add_column("identical", justify="right", overflow="fold")
    table.add_column("per prompt (agree/fp16 length)", justify="left", overflow="fold")
    for arm in greedy["arms"]:
        per = " ".join(
            f"{p['arms'][arm['label']]['agree_tokens']}/{p['reference']['tokens']}"
            for p in greedy["prompts"]
        )
        table.add_row(
            arm["label"],
            f"{arm['mean_agree_tokens']:.1f}",
            str(arm["min_agree_tokens"]),
            f"{arm['identical']}/{arm['prompts']}",
            per,
        )
    return table


def passkey_table(pk: Mapping[str, Any]) -> Table:
    title = f"passkey retrieval (key at {pk['position']:.0%} of the haystack)"
    if pk["skipped_depths"]:
        title += f"; skipped (beyond context): {', '.join(map(str, pk['skipped_depths']))}"
    table = Table(title=title, title_justify="left", show_edge=False)
    table.add_column("depth", justify="right", overflow="fold")
    table.add_column("tokens", justify="right", overflow="fold")
    for label in pk["labels"]:
        table.add_column(label, justify="center", overflow="fold")
    for row in pk["depths"]:
        cells = ["found" if row["results"][lab]["found"] else "MISSED" for lab in pk["labels"]]
        table.add_row(str(row["depth"]), str(row["prompt_tokens"]), *cells)
    return table


def eval_tables(record: Mapping[str, Any]) -> Sequence[Table]:
    tables: list[Table] = []
    if record.get("kld"):
        tables.append(kld_table(record["kld"]))
    if record.get("greedy"):
        tables.append(greedy_table(record["greedy"]))
    if record.get("passkey"):
        tables.append(passkey_table(record["passkey"]))
    return tables
