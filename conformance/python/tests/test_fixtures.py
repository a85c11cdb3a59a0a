"""attn_conform against the `attn-conform` command on the committed fixtures: the same
reference, the same rows, the same verdicts, and case files the command accepts."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest

import attn_conform as ac
from conftest import FIXTURES, fixture_files, known_failure, run_cli, smallest_per_op


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture(scope="session")
def dumped(cli, tmp_path_factory) -> Path:
    """`attn-conform verify --dump-reference` of every committed fixture, once."""
    out = tmp_path_factory.mktemp("reference")
    r = run_cli(cli, "verify", "--dump-reference", str(out), str(FIXTURES))
    # exit 1 only for the fixtures kept to show an upstream failure (`known_failure`)
    known = any(known_failure(f) for f in fixture_files())
    assert r.returncode == 0 or (known and r.returncode == 1), r.stderr
    return out


def test_there_are_fixtures():
    assert len(fixture_files()) >= 50, FIXTURES
    assert len(smallest_per_op()) == len(ac.ops())


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_reference_matches_the_command(path, dumped):
    case = ac.load_case(path)
    mine = ac.reference(case.op, case.inputs, case.params)
    theirs = ac.load_case(dumped / case.op / path.name)
    assert theirs.source["impl"] == "attn-reference"
    assert sorted(mine) == sorted(theirs.outputs)
    for name, a in mine.items():
        assert same_bits(a, theirs.outputs[name]), name


@pytest.mark.parametrize("path", smallest_per_op(), ids=lambda p: p.parent.name)
def test_check_gives_the_rows_of_verify_json(path, cli):
    case = ac.load_case(path)
    rows = ac.check(case.op, case.inputs, case.outputs, case.params, case.tolerance)
    assert rows and all(r["pass"] for r in rows), ac.format_rows(rows)
    r = run_cli(cli, "verify", "--json", str(path))
    assert r.returncode == 0, r.stderr
    theirs = json.loads(r.stdout)
    for row in (*rows, *theirs):
        del row["file"]
    assert rows == theirs


def plant(case: ac.Case, rng: np.random.Generator):
    """Changes one finite element of the first float output compared whole (no parts) far
    beyond any threshold; returns the output name, the index and the new value."""
    spec = next(o for o in ac.ops() if o["op"] == case.op)
    reference = ac.reference(case.op, case.inputs, case.params)
    for name in (o["name"] for o in spec["outputs"]):
        out = case.outputs.get(name)
        if out is None or out.dtype.kind != "f" and out.dtype.name != "bfloat16" or out.size == 0:
            continue
        ok = np.argwhere(np.isfinite(out.astype(np.float64)) & np.isfinite(reference[name]))
        if len(ok) == 0:
            continue
        index = tuple(int(i) for i in ok[rng.integers(len(ok))])
        v = float(out[index])
        out[index] = v + 1.0 + 10.0 * abs(v)
        return name, index, float(out[index]), float(reference[name][index])
    return None


@pytest.mark.parametrize("op", [o["op"] for o in ac.ops()])
def test_check_fails_one_changed_element_at_its_index(op):
    # the smallest fixture of the op with a finite float output to change
    files = sorted((FIXTURES / op).glob("*.safetensors"), key=lambda f: f.stat().st_size)
    for path in files:
        case = ac.load_case(path)
        planted = plant(case, np.random.default_rng(zlib.crc32(path.name.encode())))
        if planted is not None:
            break
    else:
        floats = [
            n
            for f in files
            for n, a in ac.load_case(f).outputs.items()
            if a.dtype.kind == "f" or a.dtype.name == "bfloat16"
        ]
        if not floats:  # e.g. nsa_select_blocks: block indices, compared by the index rule
            pytest.skip(f"{op}: no float output (its outputs are indices)")
        pytest.fail(f"{op}: no fixture with a finite float output to change")
    parts = {o["op"]: o for o in ac.ops()}[case.op]
    name, index, value, ref = planted
    rows = ac.check(case.op, case.inputs, case.outputs, case.params, case.tolerance)
    failed = [r for r in rows if not r["pass"]]
    assert len(failed) == 1, ac.format_rows(rows)
    row = failed[0]
    assert row["output"] == name or row["output"].startswith(name + "."), parts
    if row["output"] == name:
        worst = row["diagnostics"]["worst"]
        assert tuple(worst["index"]) == index
        assert worst["candidate"] == value
        assert worst["reference"] == ref
        assert row["diagnostics"]["over_threshold"] >= 1
    with pytest.raises(AssertionError) as e:
        ac.assert_conforms(case.op, case.inputs, case.outputs, case.params, case.tolerance)
    message = str(e.value)
    assert "1 of" in message and row["output"] in message
    if row["output"] == name:
        assert f"worst element {list(index)}" in message


@pytest.mark.parametrize("path", smallest_per_op(), ids=lambda p: p.parent.name)
def test_save_case_output_passes_verify(path, cli, tmp_path):
    case = ac.load_case(path)
    out = tmp_path / "saved.safetensors"
    ac.save_case(out, case.op, case.inputs, case.outputs, case.params, case.source, case.tolerance)
    r = run_cli(cli, "verify", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    back = ac.load_case(out)
    assert (back.op, back.params, back.source) == (case.op, case.params, case.source)
    for side in ("inputs", "outputs"):
        mine, theirs = getattr(case, side), getattr(back, side)
        assert sorted(mine) == sorted(theirs)
        for name in mine:
            assert same_bits(mine[name], theirs[name]), (side, name)
    if plant(case, np.random.default_rng(7)) is not None:
        ac.save_case(out, case.op, case.inputs, case.outputs, case.params, "changed")
        r = run_cli(cli, "verify", str(out))
        assert r.returncode == 1, r.stdout + r.stderr


def test_a_failing_assert_conforms_writes_a_case_the_command_reproduces(cli, tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 64, 3)).astype(np.float32)
    y = np.cumsum(x.astype(np.float64), axis=1).astype(np.float32)
    ac.assert_conforms("cumsum", {"x": x}, {"y": y}, {"dim": 1})
    y[1, 40, 2] += 0.5
    monkeypatch.setenv("ATTN_CONFORM_SAVE_DIR", str(tmp_path))
    with pytest.raises(AssertionError) as e:
        ac.assert_conforms("cumsum", {"x": x}, {"y": y}, {"dim": 1})
    saved = tmp_path / "cumsum-0.safetensors"
    assert str(saved) in str(e.value)
    r = run_cli(cli, "verify", "--json", str(saved))
    assert r.returncode == 1
    assert json.loads(r.stdout)[0]["diagnostics"]["worst"]["index"] == [1, 40, 2]


def test_ops_is_the_data_behind_list(cli):
    r = run_cli(cli, "list", "--json")
    assert r.returncode == 0
    assert ac.ops() == json.loads(r.stdout)
