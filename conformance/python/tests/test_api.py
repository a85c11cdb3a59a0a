"""attn_conform on NumPy arrays: every case dtype bit for bit, any memory layout, and bad
arguments refused with the argument named."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import attn_conform as ac
from conftest import run_cli

RNG = np.random.default_rng(20261124)


def x32(shape=(2, 50, 3)) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize(
    "dtype", [np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)], ids=["bfloat16", "float16"]
)
def test_half_dtypes_round_trip_bit_exactly(dtype, tmp_path):
    # every 16-bit pattern: zeros of both signs, subnormals, infinities, NaN payloads
    bits = np.arange(1 << 16, dtype=np.uint16)
    RNG.shuffle(bits)
    x = bits.view(dtype).reshape(256, 256)
    path = tmp_path / "half.safetensors"
    ac.save_case(path, "cumsum", {"x": x}, {}, {"dim": 1})
    back = ac.load_case(path).inputs["x"]
    assert back.dtype == dtype
    assert np.array_equal(back.view(np.uint16), bits.reshape(256, 256))


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "int64"])
def test_other_dtypes_round_trip_bit_exactly(dtype, tmp_path):
    if dtype.startswith("float"):
        x = RNG.standard_normal((3, 5)).astype(dtype)
        x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, -0.0
        inputs, op, params = {"x": x}, "cumsum", {"dim": 0}
    else:
        cu = np.array([0, 3, 3, 9], dtype=dtype)
        inputs = {"g": RNG.standard_normal((1, 9, 2)).astype(np.float32), "cu_seqlens": cu}
        op, params = "chunk_local_cumsum", {"chunk_size": 4}
    path = tmp_path / "c.safetensors"
    ac.save_case(path, op, inputs, {}, params)
    back = ac.load_case(path).inputs
    for name, a in inputs.items():
        assert same_bits(back[name], a), name


def test_layout_and_byte_order_do_not_change_the_values():
    x = x32((3, 40, 2))
    want = ac.reference("cumsum", {"x": x}, {"dim": 1})["y"]
    assert want.dtype == np.float64 and want.shape == x.shape
    np.testing.assert_allclose(want, np.cumsum(x.astype(np.float64), axis=1), rtol=1e-12)
    strided = np.ascontiguousarray(x.transpose(2, 1, 0)).transpose(2, 1, 0)  # Fortran-like
    assert not strided.flags.c_contiguous
    big = x.astype(">f4")
    for same in (strided, big, x[::1, ::1, ::1].copy()):
        assert same_bits(ac.reference("cumsum", {"x": same}, {"dim": 1})["y"], want)
    # a sliced view is its own values
    view = x[:, ::2, :]
    assert same_bits(
        ac.reference("cumsum", {"x": view}, {"dim": 1})["y"],
        ac.reference("cumsum", {"x": view.copy()}, {"dim": 1})["y"],
    )


def test_bfloat16_inputs_are_widened_exactly():
    x = x32((2, 33, 2)).astype(ml_dtypes.bfloat16)
    y = ac.reference("cumsum", {"x": x}, {"dim": 1})["y"]
    np.testing.assert_array_equal(y, np.cumsum(x.astype(np.float64), axis=1))
    params = {"dim": 1, "output_dtype": "float32"}
    rows = ac.check("cumsum", {"x": x}, {"y": y.astype(np.float32)}, params)
    assert [r["pass"] for r in rows] == [True]
    # without output_dtype the output follows x: a bfloat16 result is expected
    rows = ac.check("cumsum", {"x": x}, {"y": y.astype(np.float32)}, {"dim": 1})
    reason = rows[0]["reason"]
    assert reason.startswith("dtype float32, expected bfloat16 or float16"), reason
    assert "output_dtype = null" in reason and rows[0]["diagnostics"] is None


def test_tolerance_overrides_the_threshold():
    x = x32()
    y = np.cumsum(x.astype(np.float64), axis=1).astype(np.float32)
    y[0, 10, 1] += 1e-3
    rows = ac.check("cumsum", {"x": x}, {"y": y}, {"dim": 1})
    assert not rows[0]["pass"] and rows[0]["threshold"] == 1e-5
    assert rows[0]["diagnostics"]["worst"]["index"] == [0, 10, 1]
    rows = ac.check("cumsum", {"x": x}, {"y": y}, {"dim": 1}, tolerance={"y": 1e-2})
    assert rows[0]["pass"] and rows[0]["threshold"] == 1e-2
    assert rows[0]["diagnostics"] is None


def test_non_finite_mismatches_are_counted_from_the_first():
    x = x32((2, 8, 3))
    y = np.cumsum(x.astype(np.float64), axis=1).astype(np.float32)
    y[1, 2, 0], y[1, 6, 2], y[0, 7, 1] = np.nan, np.inf, np.nan
    with pytest.raises(AssertionError) as e:
        ac.assert_conforms("cumsum", {"x": x}, {"y": y}, {"dim": 1})
    assert "3 non-finite mismatches, the first at [0, 7, 1]" in str(e.value)
    d = ac.check("cumsum", {"x": x}, {"y": y}, {"dim": 1})[0]["diagnostics"]["nonfinite"]
    assert (d["count"], d["first_index"], d["candidate"]) == (3, [0, 7, 1], "NaN")


x = x32()
BAD = [
    # (call, exception, the message starts with)
    (lambda: ac.reference(3, {"x": x}, {"dim": 1}), TypeError, "op:"),
    (lambda: ac.reference("nope", {"x": x}), ValueError, "op:"),
    (lambda: ac.reference("cumsum", [x], {"dim": 1}), TypeError, "inputs:"),
    (lambda: ac.reference("cumsum", {1: x}, {"dim": 1}), TypeError, "inputs:"),
    (lambda: ac.reference("cumsum", {"x": [1.0, 2.0]}, {"dim": 1}), TypeError, "inputs['x']"),
    (lambda: ac.reference("cumsum", {"x": x.astype(np.int8)}, {"dim": 1}), TypeError, "inputs['x']"),
    (lambda: ac.reference("cumsum", {"x": x.astype(bool)}, {"dim": 1}), TypeError, "inputs['x']"),
    (lambda: ac.reference("cumsum", {"x": x.astype(np.int32)}, {"dim": 1}), TypeError, "inputs['x']"),
    (lambda: ac.reference("cumsum", {"q": x}, {"dim": 1}), ValueError, "inputs['q']"),
    (lambda: ac.reference("cumsum", {}, {"dim": 1}), ValueError, "inputs['x']: missing"),
    (lambda: ac.reference("chunk_local_cumsum", {"g": x}), ValueError, "params:"),
    (lambda: ac.reference("cumsum", {"x": x}, [1]), TypeError, "params:"),
    (lambda: ac.reference("cumsum", {"x": x}, {"dim": "1"}), TypeError, "params['dim']"),
    (lambda: ac.reference("cumsum", {"x": x}, {"dim": 7}), ValueError, "params['dim']"),
    (lambda: ac.reference("cumsum", {"x": x}, {"dim": 1, "foo": 2}), ValueError, "params:"),
    (lambda: ac.reference("cumsum", {"x": x}, {"dim": object()}), TypeError, "params['dim']"),
    (lambda: ac.reference("cumsum", {"x": x}, {"dim": float("nan")}), ValueError, "params['dim']"),
    (lambda: ac.reference("cumsum", {"x": x}, {"dim": 1}, device="tpu"), ValueError, "device:"),
    (lambda: ac.reference("cumsum", {"x": x}, {"dim": 1}, device=0), TypeError, "device:"),
    (
        lambda: ac.reference(
            "chunk_local_cumsum",
            {"g": x, "cu_seqlens": np.array([0, 60], dtype=np.int32)},
            {"chunk_size": 4},
        ),
        ValueError,
        "inputs['cu_seqlens']",
    ),
    (lambda: ac.check("cumsum", {"x": x}, {"z": x}, {"dim": 1}), ValueError, "outputs['z']"),
    (lambda: ac.check("cumsum", {"x": x}, {"y": x}, {"dim": 1}, [1e-3]), TypeError, "tolerance:"),
    (lambda: ac.check("cumsum", {"x": x}, {"y": x}, {"dim": 1}, {"y": "a"}), TypeError, "tolerance['y']"),
    (lambda: ac.check("cumsum", {"x": x}, {"y": x}, {"dim": 1}, {"y": -1.0}), ValueError, "tolerance['y']"),
    (lambda: ac.check("cumsum", {"x": x}, {"y": x}, {"dim": 1}, {"w": 1e-3}), ValueError, "tolerance"),
    (lambda: ac.save_case(3, "cumsum", {"x": x}, {}, {"dim": 1}), TypeError, "path:"),
    (lambda: ac.save_case("/no/such/dir/c.safetensors", "cumsum", {"x": x}, {}, {"dim": 1}), OSError, "path:"),
    (lambda: ac.save_case("c.safetensors", "cumsum", {"x": x}, {}, {"dim": 1}, {"version": 1}), ValueError, "source:"),
    (lambda: ac.save_case("c.safetensors", "cumsum", {"x": x}, {}, {"dim": 1}, 5), TypeError, "source:"),
    (lambda: ac.save_case("c.safetensors", "cumsum", {"x": x}, {}, {"dim": 1}, note=1), TypeError, "note:"),
    (lambda: ac.load_case("/no/such/case.safetensors"), OSError, "path:"),
]


@pytest.mark.parametrize("call,exc,prefix", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_arguments_raise_naming_the_argument(call, exc, prefix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(exc) as e:
        call()
    assert str(e.value).startswith(prefix), str(e.value)
    assert not (tmp_path / "c.safetensors").exists(), "a refused case is not written"


def test_a_file_that_is_not_a_case_is_a_value_error_naming_the_path(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(ValueError, match="^path: .*bad.safetensors"):
        ac.load_case(bad)


def test_gpu_reference_without_a_gpu_says_why():
    try:
        out = ac.reference("cumsum", {"x": x}, {"dim": 1}, device="gpu")
    except RuntimeError as e:
        assert str(e).startswith("device: no GPU"), str(e)
    else:
        # a GPU answered: its output conforms
        ac.assert_conforms("cumsum", {"x": x}, out, {"dim": 1})


def gdn_inputs(t: int = 8) -> dict[str, np.ndarray]:
    """A small float32 ``gdn_fwd`` call: one sequence of ``t`` tokens, one head, K = V = 4."""
    r = np.random.default_rng(25)
    f = lambda *shape: r.standard_normal(shape).astype(np.float32)  # noqa: E731
    return {
        "q": f(1, t, 1, 4),
        "k": f(1, t, 1, 4),
        "v": f(1, t, 1, 4),
        "g": -np.abs(f(1, t, 1)),
        "beta": r.uniform(size=(1, t, 1)).astype(np.float32),
    }


@pytest.mark.parametrize(
    "gpus, exc, message",
    [
        (0, ValueError, "^gpus: expected a number of GPUs >= 1, got 0$"),
        (-2, ValueError, "^gpus: expected a number of GPUs >= 1, got -2$"),
        (True, TypeError, "^gpus: expected an int"),
        (1.5, TypeError, "^gpus: expected an int"),
        ("2", TypeError, "^gpus: expected an int"),
    ],
)
def test_gpus_below_one_or_not_an_int_is_refused_naming_gpus(gpus, exc, message):
    with pytest.raises(exc, match=message):
        ac.reference("gdn_fwd", gdn_inputs(), device="gpu", gpus=gpus)


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_gpus_with_the_cpu_device_is_refused(gpus):
    with pytest.raises(ValueError, match='^gpus: .*device="gpu".*got device="cpu"'):
        ac.reference("gdn_fwd", gdn_inputs(), device="cpu", gpus=gpus)


def test_gpus_for_an_op_without_the_context_parallel_path_is_refused():
    with pytest.raises(ValueError, match="^gpus: `cumsum` has no context-parallel path .*kda_fwd"):
        ac.reference("cumsum", {"x": x32()}, {"dim": 1}, device="gpu", gpus=2)


def test_more_gpus_than_the_host_has_is_an_error_naming_gpus():
    # no GPU here: RuntimeError (no GPU); with GPUs: ValueError (at most the host's count)
    with pytest.raises((ValueError, RuntimeError), match="^gpus: "):
        ac.reference("gdn_fwd", gdn_inputs(), device="gpu", gpus=4096)


def test_the_ops_with_the_context_parallel_path_list_it_among_their_devices():
    devices = {o["op"]: o["devices"] for o in ac.ops()}
    for op in ("chunk_gated_delta_rule_fwd_h", "kda_fwd", "gdn_fwd"):
        assert devices[op] == ["cpu", "gpu", "gpus"], op
    assert "gpus" not in devices["cumsum"]


def test_gpus_one_conforms_where_a_gpu_and_nccl_answer():
    inputs, params = gdn_inputs(200), {"output_final_state": True}
    try:
        out = ac.reference("gdn_fwd", inputs, params, device="gpu", gpus=1)
    except RuntimeError as e:
        assert str(e).startswith("gpus: "), str(e)
        if os.environ.get("ATTN_REQUIRE_GPU") == "1":
            raise
        pytest.skip(f"no GPU or no NCCL: {e}")
    assert set(out) == {"o", "final_state"}
    ac.assert_conforms("gdn_fwd", inputs, out, params)


def test_docstrings_list_every_op_with_its_shapes_and_params():
    for f in (ac.reference, ac.check, ac.assert_conforms, ac.save_case):
        for o in ac.ops():
            assert f"    {o['op']}  [" in f.__doc__
            for i in o["inputs"]:
                assert f"{i['name']}{'' if i['required'] else '?'} {i['shape']}  {i['dtype']}" in f.__doc__
    assert "chunk_size (required)" in ac.reference.__doc__
    assert "w [B, T, HV, K]  float, as k" in ac.check.__doc__


def test_ops_give_every_input_and_output_a_shape_and_a_dtype():
    for o in ac.ops():
        path, _, section = o["spec"].partition(" §")
        assert path.startswith("conformance/spec/") and path.endswith(".md") and section, o
        for t in (*o["inputs"], *o["outputs"]):
            assert t["shape"] and t["dtype"], (o["op"], t)
    fwd_h = next(o for o in ac.ops() if o["op"] == "chunk_gated_delta_rule_fwd_h")
    w = next(i for i in fwd_h["inputs"] if i["name"] == "w")
    assert (w["shape"], w["required"]) == ("[B, T, HV, K]", True)
    cu = next(i for i in fwd_h["inputs"] if i["name"] == "cu_seqlens")
    assert (cu["shape"], cu["dtype"], cu["required"]) == ("[N + 1]", "int32|int64", False)
    v_new = next(x for x in fwd_h["outputs"] if x["name"] == "v_new")
    assert v_new["present"] == "when save_new_value"


def test_contract_is_the_text_of_list_op(cli):
    text = ac.contract("chunk_gated_delta_rule_fwd_h")
    assert "w              [B, T, HV, K]" in text, text
    assert "conformance/spec/ops-delta-rule.md §2" in text
    assert text == run_cli(cli, "list", "chunk_gated_delta_rule_fwd_h").stdout
    with pytest.raises(ValueError, match="^op: unknown op `nope`"):
        ac.contract("nope")


# What a user types, and the message that names it as typed: keys of `inputs` / `outputs`, never
# the case file's `in.w` / `out.out`; a rank error with the layout; a head mismatch naming both
# tensors.
def _fwd_h(h: int = 2, **over):
    rng = np.random.default_rng(0)
    t = {
        "k": rng.standard_normal((1, 8, h, 4)).astype(np.float32),
        "w": rng.standard_normal((1, 8, 4, 4)).astype(np.float32),
        "u": rng.standard_normal((1, 8, 4, 3)).astype(np.float32),
    }
    t.update(over)
    return {k: v for k, v in t.items() if v is not None}


MESSAGES = [
    (
        lambda: ac.reference("chunk_gated_delta_rule_fwd_h", _fwd_h(w=None)),
        ValueError,
        "inputs['w']: missing: `chunk_gated_delta_rule_fwd_h` requires it (inputs: k, w, u,",
    ),
    (
        lambda: ac.reference("chunk_gated_delta_rule_fwd_h", _fwd_h(wk=x)),
        ValueError,
        "inputs['wk']: not an input of `chunk_gated_delta_rule_fwd_h` (inputs of",
    ),
    (
        lambda: ac.check("cumsum", {"x": x}, {"out": x}, {"dim": 1}),
        ValueError,
        "outputs['out']: not an output of `cumsum` (outputs of `cumsum`: y)",
    ),
    (
        lambda: ac.reference("chunk_gated_delta_rule_fwd_h", _fwd_h(k=np.zeros((8, 2, 4), np.float32))),
        ValueError,
        "inputs['k']: bad shape for `k`: expected rank 4 [B, T, H, K], got [8, 2, 4]",
    ),
    (
        lambda: ac.reference("chunk_gated_delta_rule_fwd_h", _fwd_h(h=3)),
        ValueError,
        "inputs['u']: bad shape for `u`: expected HV a multiple of H = 3 (`k` is [B, T, H, K] = "
        "[1, 8, 3, 4]), got [1, 8, 4, 3]",
    ),
    (
        lambda: ac.reference(
            "chunk_local_cumsum",
            {"g": x, "cu_seqlens": np.array([0, 60], dtype=np.int32)},
            {"chunk_size": 4},
        ),
        ValueError,
        "inputs['cu_seqlens']: bad shape for `cu_seqlens`: expected batch size B == 1 when "
        "cu_seqlens is given, got B = 2",
    ),
]


@pytest.mark.parametrize("call,exc,message", MESSAGES, ids=[m[2][:24] for m in MESSAGES])
def test_messages_name_what_the_user_typed(call, exc, message):
    with pytest.raises(exc) as e:
        call()
    assert str(e.value).startswith(message), str(e.value)
    assert "in." not in str(e.value) and "out." not in str(e.value), str(e.value)


def test_a_half_output_of_a_float32_case_names_the_dtypes_and_output_dtype():
    o = ac.reference("chunk_local_cumsum", {"g": x}, {"chunk_size": 4})["o"]
    rows = ac.check("chunk_local_cumsum", {"g": x}, {"o": o.astype(np.float16)}, {"chunk_size": 4})
    assert rows[0]["reason"] == (
        'dtype float16, expected float32 (or float64) (set by the parameter output_dtype = '
        '"float32"; it takes "float32" | "float64" | null, null meaning the input\'s dtype)'
    ), rows[0]["reason"]
