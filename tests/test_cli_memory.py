"""Plumbing (hand-written): tests for `dsml memory`, the memory accountant and the layout search
on the command line (dsml.cli). The printed numbers are held against dsml.memory called
directly: the command must print what the library computes, per part, per stage, and in the
order the search returns."""
from __future__ import annotations

import dataclasses
import re

import pytest

from dsml.cli import MEMORY_PARTS, main
from dsml.model_config import TransformerConfig, preset
from dsml.memory import GB, Layout, memory_per_rank, params_per_rank, stage_memory
from dsml.step_model import estimate_step
from dsml.layout_search import search_layouts

SEARCH_COLUMNS = ["rank", "step (s)", "MFU", "GB/rank", "stage", "m", "layout"]


def run_memory(capsys, *argv):
    """Run `dsml memory ...` in this process; return (exit code, stdout, stderr)."""
    code = main(["memory", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def parts(out: str) -> dict[str, tuple[float, float]]:
    """The breakdown of the most loaded rank: part -> (bytes, GB) as printed."""
    found = {}
    for line in out.splitlines():
        fields = line.split()
        if fields and fields[0] in MEMORY_PARTS and not line.startswith("#"):
            assert len(fields) == 3, f"a breakdown row is part, bytes, GB; got {line!r}"
            found[fields[0]] = (float(fields[1].replace(",", "")), float(fields[2]))
    return found


def stage_rows(out: str) -> list[list[str]]:
    """The per-stage table's rows: stage, parameters held, then GB of each part."""
    return [line.split() for line in out.splitlines()
            if line.strip() and not line.startswith("#") and line.split()[0].isdigit()]


def search_rows(out: str) -> list[dict[str, str]]:
    rows = []
    for line in out.splitlines():
        if line.strip() and not line.startswith("#"):
            fields = line.split(maxsplit=len(SEARCH_COLUMNS) - 1)
            assert len(fields) == len(SEARCH_COLUMNS), f"a search row has 7 columns: {line!r}"
            rows.append(dict(zip(SEARCH_COLUMNS, fields)))
    return rows


def layout_args(layout: Layout) -> list[str]:
    argv = ["--dp", layout.dp, "--tp", layout.tp, "--pp", layout.pp, "--zero", layout.zero,
            "--micro-batch", layout.micro_batch, "--microbatches", layout.microbatches,
            "--recompute", layout.recompute, "--precision", layout.precision,
            "--schedule", layout.schedule]
    return argv + ["--sequence-parallel"] * layout.sequence_parallel


CASES = [
    ("gpt2", Layout(dp=8, tp=2, pp=2, zero=1, microbatches=8)),
    ("gpt2", Layout()),
    ("gpt2-xl", Layout(dp=2, pp=4, zero=1, micro_batch=2, microbatches=3, recompute="full",
                       precision="fp32", schedule="gpipe")),
    ("llama2-7b", Layout(dp=4, tp=4, pp=1, zero=3, micro_batch=2, microbatches=8,
                         recompute="selective", sequence_parallel=True)),
    ("llama2-70b", Layout(dp=1, tp=8, pp=10, microbatches=16, sequence_parallel=True)),
]


# --- one layout: the printed numbers are the accountant's -------------------------------------

@pytest.mark.parametrize("name,layout", CASES)
def test_printed_breakdown_is_memory_per_rank(capsys, name, layout):
    code, out, err = run_memory(capsys, "--model", name, *layout_args(layout))
    assert code == 0 and err == "", err
    want = memory_per_rank(preset(name), layout)
    printed = parts(out)
    assert list(printed) == list(MEMORY_PARTS)
    for part, (nbytes, gb) in printed.items():
        assert nbytes == pytest.approx(getattr(want, part), abs=0.5), (
            f"{name} {layout.label()}: printed {part} {nbytes:,.0f} B, memory_per_rank says "
            f"{getattr(want, part):,.1f} B")
        assert gb == pytest.approx(getattr(want, part) / GB, abs=5e-4)
    assert f"{preset(name).num_params():,} parameters (exact)" in out
    assert layout.label() in out
    where = f"stage {want.stage} of {layout.pp}" if layout.pp > 1 else "every rank alike"
    assert f"the most loaded rank: {where}" in out
    step = estimate_step(preset(name), layout)
    seconds, mfu = re.search(r"when pp = 1\): (\S+) s, MFU (\S+)", out).groups()
    assert float(seconds) == pytest.approx(step.seconds, rel=1e-3)
    assert float(mfu) == pytest.approx(step.mfu, abs=5e-4)


@pytest.mark.parametrize("name,layout", [case for case in CASES if case[1].pp > 1])
def test_one_row_per_pipeline_stage(capsys, name, layout):
    _, out, _ = run_memory(capsys, "--model", name, *layout_args(layout))
    config = preset(name)
    rows = stage_rows(out)
    assert [int(row[0]) for row in rows] == list(range(layout.pp))
    for row in rows:
        stage = int(row[0])
        want = stage_memory(config, layout, stage)
        assert int(row[1].replace(",", "")) == params_per_rank(config, layout.tp, layout.pp,
                                                               stage)
        for part, text in zip(MEMORY_PARTS, row[2:], strict=True):
            assert float(text) == pytest.approx(getattr(want, part) / GB, abs=5e-4), (
                f"stage {stage} {part}")
    # the headline is the largest of them
    totals = [float(row[-1]) for row in rows]
    assert parts(out)["total"][1] == pytest.approx(max(totals), abs=5e-4)


def test_a_single_stage_prints_no_stage_table(capsys):
    _, out, _ = run_memory(capsys, "--model", "gpt2", "--dp", 4)
    assert "per pipeline stage" not in out and stage_rows(out) == []


def test_gpipe_holds_every_micro_batch_1f1b_fewer(capsys):
    base = ["--model", "gpt2", "--pp", 4, "--microbatches", 8]
    _, one_f_one_b, _ = run_memory(capsys, *base)
    _, gpipe, _ = run_memory(capsys, *base, "--schedule", "gpipe")
    assert parts(gpipe)["activations"][0] == pytest.approx(
        2 * parts(one_f_one_b)["activations"][0])      # stage 0: 8 in flight against 4


# --- the model: a preset or explicit sizes ---------------------------------------------------

def body(out: str) -> list[str]:
    """Everything but the first line (which names the model)."""
    return out.splitlines()[1:]


def test_explicit_gpt_sizes_equal_the_gpt2_preset(capsys):
    layout = ["--dp", 4, "--tp", 3, "--pp", 3, "--zero", 1, "--microbatches", 6]
    _, by_name, _ = run_memory(capsys, "--model", "gpt2", *layout)
    code, by_sizes, err = run_memory(capsys, "--layers", 12, "--hidden", 768, "--heads", 12,
                                     "--vocab", 50257, "--seq-len", 1024, *layout)
    assert code == 0, err
    assert body(by_sizes) == body(by_name)
    assert "gpt-style l=12 h=768 a=12 V=50257, 124,439,808 parameters" in by_sizes


def test_explicit_llama_sizes_equal_the_llama2_70b_preset(capsys):
    layout = ["--tp", 8, "--pp", 4, "--microbatches", 6, "--device-memory", 80]
    _, by_name, _ = run_memory(capsys, "--model", "llama2-70b", *layout)
    _, by_sizes, _ = run_memory(capsys, "--layers", 80, "--hidden", 8192, "--heads", 64,
                                "--vocab", 32000, "--seq-len", 4096, "--kv-heads", 8,
                                "--ffn-hidden", 28672, "--style", "llama", *layout)
    assert body(by_sizes) == body(by_name)


def test_gpt_sizes_take_kv_heads_and_ffn_hidden(capsys):
    _, out, _ = run_memory(capsys, "--layers", 2, "--hidden", 64, "--heads", 8, "--vocab", 100,
                           "--seq-len", 32, "--kv-heads", 2, "--ffn-hidden", 96)
    config = TransformerConfig(2, 64, 8, 100, 32, kv_heads=2, ffn_hidden=96)
    assert f"{config.num_params():,} parameters" in out
    assert parts(out)["total"][0] == pytest.approx(memory_per_rank(config, Layout()).total,
                                                   abs=0.5)


def test_seq_len_replaces_the_presets(capsys):
    _, out, _ = run_memory(capsys, "--model", "gpt2", "--seq-len", 2048, "--dp", 2)
    config = dataclasses.replace(preset("gpt2"), seq_len=2048)
    assert f"{config.num_params():,} parameters (exact), seq_len 2048 (the preset's: 1024)" in out
    assert parts(out)["total"][0] == pytest.approx(
        memory_per_rank(config, Layout(dp=2)).total, abs=0.5)


def test_global_batch_sets_the_micro_batches(capsys):
    _, out, _ = run_memory(capsys, "--model", "gpt2", "--dp", 4, "--pp", 2, "--micro-batch", 2,
                           "--global-batch", 64, "--devices", 8)
    assert "8 micro-batches per step (global batch 64)" in out
    want = memory_per_rank(preset("gpt2"), Layout(dp=4, pp=2, micro_batch=2, microbatches=8))
    assert parts(out)["total"][0] == pytest.approx(want.total, abs=0.5)


@pytest.mark.parametrize("margin,verdict", [(1e6, "yes"), (-1e6, "no")])
def test_says_whether_the_layout_fits(capsys, margin, verdict):
    layout = Layout(dp=2, tp=5, pp=2, zero=1, microbatches=4)     # gpt2-xl: 25 heads
    total = memory_per_rank(preset("gpt2-xl"), layout).total
    device_gb = (total + margin) / GB
    _, out, _ = run_memory(capsys, "--model", "gpt2-xl", *layout_args(layout),
                           "--device-memory", repr(device_gb))
    line = [line for line in out.splitlines() if line.startswith("# fits in")]
    assert len(line) == 1
    assert f"GB: {verdict}, {total / GB:.3f} GB per rank" in line[0]
    assert ("to spare" if verdict == "yes" else "over") in line[0]


def test_without_device_memory_no_verdict(capsys):
    _, out, _ = run_memory(capsys, "--model", "gpt2")
    assert "fits in" not in out


# --- the search ------------------------------------------------------------------------------

@pytest.mark.parametrize("name,devices,batch,gb,top", [
    ("llama2-70b", 64, 1024, 80, 10), ("gpt2-xl", 16, 64, 4, 25), ("llama2-7b", 8, 32, 40, 3)])
def test_search_prints_the_fitting_layouts_in_the_librarys_order(capsys, name, devices, batch,
                                                                 gb, top):
    code, out, err = run_memory(capsys, "--model", name, "--search", "--devices", devices,
                                "--global-batch", batch, "--device-memory", gb, "--top", top)
    assert code == 0, err
    results = search_layouts(preset(name), devices, batch, gb * GB, only_fitting=False)
    fitting = [result for result in results if result.fits]
    assert f"# {len(fitting)} of {len(results)} layouts fit in {gb} GB" in out
    rows = search_rows(out)
    want = fitting[:top]
    assert [(row["layout"], int(row["m"])) for row in rows] == [
        (r.layout.label(), r.layout.microbatches) for r in want]
    for row, result in zip(rows, want):
        assert float(row["GB/rank"]) == pytest.approx(result.memory.total / GB, abs=5e-4)
        assert int(row["stage"]) == result.memory.stage
        assert float(row["step (s)"]) == pytest.approx(result.step.seconds, rel=1e-3)
        assert float(row["MFU"]) == pytest.approx(result.step.mfu, abs=5e-5)
        assert result.memory.total <= gb * GB
    assert [int(row["rank"]) for row in rows] == list(range(1, len(want) + 1))


def test_search_restricted_by_zero_micro_batch_and_recompute(capsys):
    _, out, _ = run_memory(capsys, "--model", "llama2-13b", "--search", "--devices", 32,
                           "--global-batch", 256, "--device-memory", 80, "--zero", 1,
                           "--micro-batch", 2, "--recompute", "full", "--top", 50)
    results = search_layouts(preset("llama2-13b"), 32, 256, 80 * GB, micro_batches=(2,),
                             zero_stages=(1,), recompute=("full",), only_fitting=False)
    fitting = [r for r in results if r.fits]
    assert f"# {len(fitting)} of {len(results)} layouts fit" in out
    assert [row["layout"] for row in search_rows(out)] == [r.layout.label() for r in fitting]
    assert all("ZeRO-1 b2, full recompute" in row["layout"] for row in search_rows(out))


def test_search_where_nothing_fits_names_the_smallest(capsys):
    code, out, _ = run_memory(capsys, "--model", "llama2-70b", "--search", "--devices", 8,
                              "--global-batch", 64, "--device-memory", 10)
    assert code == 0
    results = search_layouts(preset("llama2-70b"), 8, 64, 10 * GB, only_fitting=False)
    smallest = min(results, key=lambda r: r.memory.total)
    assert f"# 0 of {len(results)} layouts fit in 10 GB" in out
    assert f"{smallest.memory.total / GB:.3f} GB per rank: {smallest.layout.label()}" in out
    assert search_rows(out) == []


# --- bad input: exit status 2, the constraint named on stderr --------------------------------

SEARCH = ["--search", "--devices", 8, "--global-batch", 64, "--device-memory", 80]


@pytest.mark.parametrize("argv,message", [
    (["--model", "gpt3"], "unknown preset 'gpt3'; valid names: gpt2, gpt2-medium"),
    ([], "give --model NAME (one of gpt2"),
    (["--model", "gpt2", "--tp", 5], "tp must divide heads: tp=5, heads=12"),
    (["--model", "llama2-70b", "--tp", 16], "tp must divide kv_heads: tp=16, kv_heads=8"),
    (["--model", "gpt2", "--pp", 5], ("pp must divide layers", "pp=5, layers=12")),
    (["--model", "gpt2", "--pp", 24], ("pp must divide layers", "pp=24, layers=12")),
    (["--model", "gpt2", "--dp", 2, "--tp", 2, "--devices", 8],
     "dp × tp × pp must equal --devices 8, got 2 × 2 × 1 = 4"),
    (["--model", "gpt2", "--microbatches", 0], "microbatches must be an integer ≥ 1, got 0"),
    (["--model", "gpt2", "--dp", 0], "dp must be an integer ≥ 1, got 0"),
    (["--model", "gpt2", "--schedule", "zb"], "schedule must be one of '1f1b', 'gpipe'"),
    (["--model", "gpt2", "--recompute", "some"], "recompute must be one of 'none'"),
    (["--model", "gpt2", "--precision", "fp16"], "precision must be one of 'mixed', 'bf16', 'fp32'"),
    (["--model", "gpt2", "--zero", 4], "zero must be 0, 1, 2 or 3, got 4"),
    (["--model", "gpt2", "--dp", 2, "--pp", 2, "--zero", 2, "--microbatches", 4],
     ("zero=2 with pp=2 is refused", "DeepSpeed refuses ZeRO-2/3 with pipeline parallelism")),
    (["--model", "gpt2", "--device-memory", 0], "--device-memory must be > 0 GB"),
    (["--model", "gpt2", "--dp", 2, "--global-batch", 7],
     "--global-batch must be a positive multiple of dp × micro-batch = 2 × 1 = 2, got 7"),
    (["--model", "gpt2", "--dp", 2, "--global-batch", 8, "--microbatches", 3],
     "--microbatches 3 disagrees with --global-batch 8"),
    (["--model", "gpt2", "--layers", 3], "give either --model or explicit sizes, not both"),
    (["--layers", 12, "--hidden", 768], "missing --heads, --vocab, --seq-len"),
    (["--layers", 2, "--hidden", 10, "--heads", 3, "--vocab", 5, "--seq-len", 4],
     "hidden must be divisible by heads: hidden=10, heads=3"),
    (["--layers", 2, "--hidden", 12, "--heads", 3, "--vocab", 5, "--seq-len", 4, "--style",
      "llama"], "--style llama needs --ffn-hidden"),
    (["--model", "gpt2", "--search"], "--search needs --devices, --global-batch and "
                                      "--device-memory; missing --devices"),
    (["--model", "gpt2", *SEARCH, "--pp", 2], "--search chooses dp, tp, pp"),
    (["--model", "gpt2", *SEARCH, "--sequence-parallel"], "drop --sequence-parallel"),
    (["--model", "gpt2", *SEARCH, "--top", 0], "--top must be ≥ 1, got 0"),
    (["--model", "gpt2", "--top", 3], "--top applies to --search only"),
    (["--model", "gpt2", *SEARCH, "--schedule", "zb"], "schedule must be one of"),
    (["--model", "gpt2", *SEARCH, "--zero", 5], "zero must be 0, 1, 2 or 3, got 5"),
    (["--model", "gpt2", "--search", "--devices", 7, "--global-batch", 64, "--device-memory",
      80], "no layout of 7 devices splits gpt2 with global batch 64"),
])
def test_bad_input_exits_2_naming_the_constraint(capsys, argv, message):
    code, out, err = run_memory(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith("dsml: error: ") and err.count("\n") == 1, err
    for words in (message,) if isinstance(message, str) else message:
        assert words in err, f"stderr should say {words!r}, got {err!r}"


def test_the_command_is_listed(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "memory" in capsys.readouterr().out
