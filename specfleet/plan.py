"""``specfleet plan`` / ``python -m specfleet.plan``: what specfleet would launch on one host, from
its facts, with no connection to it.

    python -m specfleet.plan --facts FACTS.json [--settings SETTINGS.json]
        [--drafter-config CONFIG.json] [--weights-bytes N] [--predicted] [--host H] [--json]

``FACTS.json`` maps fact names (``facts.gpu.Gpus``, ``facts.gpu.GpuTopology``,
``facts.sglang.SGLangInstall``, ...) to one host's values, or is the output of
``pyinfra INVENTORY fact NAME... --json`` itself, {fact: {host: value}} (``--host`` picks one host
where there are several). It may also carry ``drafter_config`` (the drafter's config.json) and
``weights_bytes``. Prints ``{argv, env, reasons}`` (exit 0) or ``{error}`` (exit 2).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from specfleet import profiles
from specfleet.core.errors import SpecfleetError
from specfleet.core.plan import FactsInputError, make_plan, one_host_facts
from specfleet.core.settings import settings_from_dict


def _load_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise FactsInputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise FactsInputError(
            f"{what} {path} is not UTF-8 text (byte {exc.start}: {exc.reason})",
            fix="write it as UTF-8 JSON (pyinfra's --json output is)",
        ) from None
    except json.JSONDecodeError as exc:
        raise FactsInputError(f"{what} {path} is not JSON: {exc}") from None
    except RecursionError:
        raise FactsInputError(f"{what} {path} is nested too deep to read") from None


@dataclass
class PlanFlags:
    """``specfleet plan``'s options: declared once, with their help, in ``specfleet.cli``."""

    facts: str | None
    settings: str | None
    drafter_config: str | None
    weights_bytes: int | None
    predicted: bool
    host: str | None
    json: bool
    profile: str | None = None  # a machine profile (specfleet.profiles) instead of --facts
    list_profiles: bool = False  # the CLI lists them instead of planning


def run(args: PlanFlags) -> int:
    def fail(message: str) -> int:
        if args.json:
            print(json.dumps({"error": message}))
        else:
            print(f"specfleet: {message}", file=sys.stderr)  # the prefix of every CLI error
        return 2

    profile_name = args.profile
    predicted = args.predicted
    try:
        if profile_name:
            profile = profiles.load(profile_name)
            facts = dict(profile["facts"])
            predicted = True  # a machine type has no SGLang installed: settings.sglang.version's
            print(f"profile {profile_name}: {profile['machine']} (no connection; "
                  f"{profile['source']}); SGLang predicted from settings.sglang.version",
                  file=sys.stderr if args.json else sys.stdout)
        else:
            facts = _load_json(args.facts, "facts file")
            if not isinstance(facts, dict):
                raise FactsInputError(
                    f"facts file {args.facts} must hold a JSON object of fact names")
            facts = one_host_facts(facts, args.host)
            missing = [name for name in ("facts.gpu.Gpus", "facts.gpu.GpuTopology")
                       if name not in facts]
            if missing:
                raise FactsInputError(
                    f"facts file {args.facts} has no {' and no '.join(missing)}: the plan would "
                    "have to guess the GPUs and whether they are on NVLink",
                    fix="gather them with pyinfra INVENTORY fact facts.gpu.Gpus "
                    "facts.gpu.GpuTopology --json (or specfleet probe), or preview a machine "
                    "type with --profile NAME")
        settings_data = _load_json(args.settings, "settings file") if args.settings else None
        if settings_data is not None and not isinstance(settings_data, dict):
            raise FactsInputError(f"settings file {args.settings} must hold a JSON object")
        drafter_config = facts.get("drafter_config")
        if args.drafter_config:
            drafter_config = _load_json(args.drafter_config, "drafter config")
        if drafter_config is not None and not isinstance(drafter_config, dict):
            raise FactsInputError(
                "drafter_config must be a JSON object (the drafter's config.json)"
            )
        weights = (
            args.weights_bytes if args.weights_bytes is not None else facts.get("weights_bytes")
        )
        if weights is not None and (isinstance(weights, bool) or not isinstance(weights, int)):
            raise FactsInputError(f"weights_bytes must be an integer, got {weights!r}")
        settings = settings_from_dict(settings_data, host=args.host or "")
        plan = make_plan(
            facts,
            settings,
            drafter_config,
            predicted=predicted,
            weights_bytes=weights,
            host=args.host,
        )
    except SpecfleetError as exc:
        return fail(exc.render())
    except Exception as exc:  # noqa: BLE001 - the CLI's promise: an error line, never a traceback
        return fail(
            f"unexpected {type(exc).__name__} while planning: {exc}\n  fix: this is a bug in "
            "specfleet; please report it with the facts file"
        )
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(plan.render())
    return 0


if __name__ == "__main__":  # ``python -m specfleet.plan ARGS`` is ``specfleet plan ARGS``
    from specfleet.cli import main

    sys.exit(main(["plan", *sys.argv[1:]]))
