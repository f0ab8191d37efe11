"""`spinkv eval --suite TIER`: checks every input before the model loads, runs the suite,
prints tables (or --json) and writes --plot DIR."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from spinkv.cli.render import print_note, progress_bar, stderr, stdout
from spinkv.errors import InvalidInputError
from spinkv.eval import suite as suite_mod
from spinkv.eval.arms import KvArm


def suite_parts(only: str | None) -> tuple[str, ...]:
    if not only:
        return suite_mod.PARTS
    parts = tuple(p.strip() for p in only.split(",") if p.strip())
    unknown = [p for p in parts if p not in suite_mod.PARTS]
    if unknown or not parts:
        raise InvalidInputError(
            f"--only {only!r} with --suite: choose from {', '.join(suite_mod.PARTS)}"
        )
    return parts


def _read_record(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidInputError(f"--merge: cannot read {path}: {exc.strerror}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"--merge: {path} is not a JSON suite record") from exc
    if not isinstance(data, dict):
        raise InvalidInputError(f"--merge: {path} is not a JSON suite record")
    return data


def run_suite(
    *,
    model: str | None,
    threads: int | None,
    arms: list[KvArm],
    tier: str,
    prereg: Path | None,
    only: str | None,
    tokens: int | None,
    seed: int | None,
    plot: Path | None,
    json_output: bool,
    merge: str | None = None,
    families: str | None = None,
    texts: str | None = None,
) -> None:
    settings = suite_mod.SuiteSettings(
        arms=arms,
        tier=tier,
        prereg_path=prereg,
        parts=suite_parts(only),
        corpus_tokens=tokens,
        seed=seed,
    )
    if families:
        settings.families = tuple(f.strip() for f in families.split(",") if f.strip())
    if texts is not None:
        settings.texts = tuple(t.strip() for t in texts.split(",") if t.strip())
    settings.validate()
    pre = suite_mod.load_prereg(settings)  # a bad file or tier fails here, before the model loads
    if "corpus" in settings.parts:
        suite_mod.corpus_texts(pre.tier(tier), settings.texts)  # --texts outside the tier
    if "tasks" in settings.parts:
        from spinkv.eval.scoring import require_sacrebleu

        require_sacrebleu()
    if plot is not None:
        from spinkv.eval.plot import require_matplotlib

        require_matplotlib()
        if plot.exists() and not plot.is_dir():
            raise InvalidInputError(f"--plot {plot} with --suite must be a directory")

    if merge:
        from spinkv.eval.merge import merge_records

        records = [_read_record(Path(p)) for p in merge.split(",")]
        try:
            record = merge_records(records, settings)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            # A record with a field missing or of the wrong type: the file's fault.
            raise InvalidInputError(
                f"--merge: {merge} is not a complete suite record ({type(exc).__name__}: {exc})"
            ) from None
    else:
        import spinkv.api as api

        loaded = api.load(model, threads=threads)
        with progress_bar(stderr) as progress:
            record = suite_mod.evaluate_suite(loaded, settings, progress)
    if plot is not None:
        from spinkv.eval.suite_plot import plot_suite

        for path in plot_suite(record, plot):
            print_note(f"wrote {path}")
    if json_output:
        sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
        return
    from spinkv.eval.suite_report import suite_tables

    for table in suite_tables(record):
        stdout.print(table)
        stdout.print()
