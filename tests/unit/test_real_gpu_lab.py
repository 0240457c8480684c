"""The lab run's verdicts (bench/real_gpu/lab_run.py) and the parts' packing rules
(bench/real_gpu/build_parts.py), on records and wheels' metadata: no GPU, no network. The lab run
must never call a pair without power a pass, and the parts must never carry the image's torch."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "real_gpu"


@pytest.fixture
def lab_run(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("RG_WORK", str(tmp_path / "work"))
    sys.path.insert(0, str(BENCH))
    from lab_placeholders import main as placeholders

    placeholders(str(tmp_path / "lab"))
    monkeypatch.setenv("RG_LAB_DIR", str(tmp_path / "lab" / "lab"))
    monkeypatch.setenv("RG_LAB_MODELS", str(tmp_path / "lab" / "models"))
    for name in ("drive", "lab_run"):
        sys.modules.pop(name, None)
    mod = importlib.import_module("lab_run")
    yield mod
    sys.path.remove(str(BENCH))
    for name in ("drive", "lab_run"):
        sys.modules.pop(name, None)


def _outputs(lab, fn):
    single = [{"output_ids": fn(i, p), "meta": {}} for i, p in enumerate(lab["prompts"])]
    batches = [[{"output_ids": fn(i, lab["prompts"][i]), "meta": {}} for i in layout]
               for layout in lab["layouts"]]
    return {"single": single, "batches": batches}


def test_power_needs_the_reference_outputs_and_conflicts(lab_run):
    lab = lab_run.load_lab()
    # The reference's own outputs (the placeholder's cycles: symbols follow different symbols).
    lab_run.RECORD["servers"]["S1"] = {"generate": _outputs(lab, lambda i, p: p["expected"])}
    ok = lab_run.power(lab)
    assert ok["verdict"] == "power" and ok["conflicts"] > 0, ok
    # Run 4's dummy weights: a 2-cycle, the next token a function of the previous one alone.
    lab_run.RECORD["servers"]["S1"] = {"generate": _outputs(lab, lambda i, p: [11, 12] * 24)}
    dead = lab_run.power(lab)
    assert dead["verdict"] == "no power"
    assert any("0 conflicts" in w for w in dead["why_not"]), dead
    # Attention but other outputs than the reference's: not a pass either.
    lab_run.RECORD["servers"]["S1"] = {"generate": _outputs(
        lab, lambda i, p: p["expected"][:-1] + [p["expected"][0] + 1])}
    assert lab_run.power(lab)["verdict"] == "no power"


def test_stale_mask_verdict_follows_the_prediction(lab_run):
    lab = lab_run.load_lab()
    ref = _outputs(lab, lambda i, p: p["expected"])
    lab_run.RECORD["servers"]["S4"] = {"generate": ref}
    # Differ exactly where stale_mask_prediction.json says (batch positions), never alone.
    stale = json.loads(json.dumps(ref))
    for li, pred in enumerate(lab["predicted"]):
        for j in pred:
            stale["batches"][li][j]["output_ids"] = [0] * 48
    lab_run.RECORD["servers"]["S5"] = {"generate": stale}
    assert lab_run.stale_vs_prediction(lab)["verdict"] == "as predicted"
    # Identical to plain: the prediction is not met.
    lab_run.RECORD["servers"]["S5"] = {"generate": ref}
    assert lab_run.stale_vs_prediction(lab)["verdict"] == "NOT as predicted"


def test_acceptance_is_sglangs_own_within_005(lab_run):
    lab = lab_run.load_lab()
    rows = [{"meta": {"completion_tokens": 48, "spec_verify_ct": 6,
                      "spec_accept_length": 8.0}}] * 3
    lab_run.RECORD["servers"]["S2"] = {"generate": {"single": rows, "batches": [],
                                                    "acceptance_length": lab_run.acceptance(rows)}}
    got = lab_run.acceptance_vs_reference("S2", "lab-drafter", lab)  # placeholder reference 7.9
    assert got["sglang"] == 8.0 and got["within_0.05"] is False
    rows = [{"meta": {"completion_tokens": 48, "spec_verify_ct": 6, "spec_accept_length": 8.0}},
            {"meta": {"completion_tokens": 47, "spec_verify_ct": 6,
                      "spec_accept_length": 47 / 6}}]  # mean 7.917, as the reference's mean
    lab_run.RECORD["servers"]["S2"]["generate"]["acceptance_length"] = lab_run.acceptance(rows)
    assert lab_run.acceptance_vs_reference("S2", "lab-drafter", lab)["within_0.05"] is True


def test_parts_never_carry_the_images_torch():
    sys.path.insert(0, str(ROOT))
    try:
        from bench.real_gpu import build_parts as bp
    finally:
        sys.path.remove(str(ROOT))
    spec = bp.SpecifierSet
    assert not bp.carried("torch", spec("==2.11.0"))
    assert not bp.carried("nvidia-cublas", spec(""))
    assert bp.carried("nvidia-cudnn-frontend", spec(""))  # flashinfer's, not in the image
    # transformers 5.6.0 excludes the image's tokenizers 0.23.2: carried; numpy never.
    assert bp.carried("tokenizers", spec("<=0.23.0,>=0.22.0"))
    assert not bp.carried("huggingface-hub", spec(">=1.3.0,<2.0"))
    assert not bp.carried("numpy", spec("<2.4"))
    assert bp.carried("ipython", spec(""))  # sglang/utils.py imports IPython.display


def test_parts_pin_kernels_as_transformers_extras_do():
    """transformers 5.6.0 imports `kernels` whenever it is installed, but pins it (<0.13) only
    under its extras; sglang 0.5.11 asks plain `kernels`. Run 5's call 1 carried 0.19.1 and every
    server died importing transformers; the pin must keep the walk to transformers' range."""
    sys.path.insert(0, str(ROOT))
    try:
        from bench.real_gpu import build_parts as bp
    finally:
        sys.path.remove(str(ROOT))
    # transformers-5.6.0's METADATA line (the `kernels` extra), as the wheel has it
    extra = bp.Requirement('kernels<0.13,>=0.12.0; extra == "kernels"')
    assert not extra.marker.evaluate(bp.ENV)  # the walk skips it: why the pin is needed
    pin = bp.SpecifierSet(bp.PINS.get("kernels", ""))
    assert not pin.contains("0.19.1")  # run 5 call 1's, which broke the import
    assert pin.contains("0.12.3")  # what served in calls 2-4
    assert all(extra.specifier.contains(v) for v in ("0.12.0", "0.12.3") if pin.contains(v))
    assert not any(pin.contains(v) for v in ("0.11.9", "0.13.0"))


def test_gate_failing_the_stale_build_counts_only_when_the_fixed_ones_pass(lab_run):
    """Run 5: the probe failed S2, S5 and S6 alike (the target's role-token chat template); the
    summary said S5 failed 'as expected'. A gate that fails everything proves nothing."""
    def gate(rc):
        out = "gate: FAILED after 14 s: ... the correctness probe failed: 0/6 answers right\n"
        return {"gates": {"probe": {"rc": rc, "output": "" if rc == 0 else out}}}

    srv = lab_run.RECORD["servers"]
    srv.update({"S2": gate(4), "S5": gate(4), "S6": gate(4)})
    got = lab_run.gate_probe_verdict()
    assert got["verdict"].startswith("INCONCLUSIVE"), got
    assert "0/6 answers right" in got["S6"]["why"]
    srv.update({"S2": gate(0), "S5": gate(4), "S6": gate(0)})
    assert lab_run.gate_probe_verdict()["verdict"] == "passes the fixed builds, fails the stale one"
    srv.update({"S5": gate(0)})
    assert lab_run.gate_probe_verdict()["verdict"].startswith("NOT as expected")


def test_rope_loss_is_checked_against_the_reference_at_1e6(lab_run):
    lab = lab_run.load_lab()
    n = len(lab["prompts"])
    lab["acceptance"]["lab-drafter-rope50k@1e6"] = {"mean": 1.552, "per_prompt": [1.552] * n}

    def served(mean):
        rows = [{"meta": {"spec_accept_length": mean}}] * n
        return {"generate": {"single": rows, "batches": [], "acceptance_length": mean}}

    lab_run.RECORD["servers"]["S8"] = served(1.5542)  # run 5's S8; S9 not run
    got = lab_run.rope_verdict(lab)
    assert got["stock_vs_reference_at_1e6"]["within_0.05"] is True
    assert got["verdict"].startswith("lost on stock as the reference at 1e6 says"), got
    # stock lower than the trained base's reference but not as the 1e6 loop: not as expected
    lab_run.RECORD["servers"]["S8"] = served(3.0)
    assert lab_run.rope_verdict(lab)["verdict"].startswith("stock NOT as expected")
    lab_run.RECORD["servers"]["S8"] = served(1.5542)
    lab_run.RECORD["servers"]["S9"] = served(lab["acceptance"]["lab-drafter-rope50k"]["mean"])
    assert lab_run.rope_verdict(lab)["verdict"] == "lost on stock, back with the patch"


def test_rg_only_runs_the_servers_in_the_order_it_names(lab_run):
    """A call short of device time runs the server named first (run 6: S9, last in S order, was
    the one left out)."""
    assert [s["tag"] for s in lab_run.servers_in_order(["S9", "S2", "S9"])] == ["S9", "S2"]
    assert [s["tag"] for s in lab_run.servers_in_order([])] == [s["tag"] for s in lab_run.SERVERS]
    with pytest.raises(SystemExit, match="S11"):
        lab_run.servers_in_order(["S11"])
