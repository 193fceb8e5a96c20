"""Issue 51 item 1, /v2: junk JSON costs what it weighs.

Each junk shape of the issue, written as a v2 inference request, is refused (or, for honest floats at the size
limit, read) by the v2 request schema (:data:`stealkit.serve.v2.SCHEMA`) in at most a few times the CPU time
and the memory ``json.loads`` takes on the same bytes. Ratios, measured in this process, never durations."""

from __future__ import annotations

import gc
import json
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from stealkit.errors import InputError
from stealkit.serve import jsonscan, payloads, v2

MB = 1 << 20
SIZE = 1 * MB
CPU_RATIO, MEMORY_RATIO = 10.0, 3.0  # generous: the schema refuses junk after a prefix, far below either


def _fill(unit: bytes, size: int) -> bytes:
    return b",".join([unit] * max(1, size // (len(unit) + 1)))


def tiny_arrays_in_objects() -> bytes:  # the issue's {"inputs":[{"a":[{},[1],[1],...]},...]}
    obj = b'{"a":[{}' + b",[1]" * 4000 + b"]}"
    return b'{"inputs":[' + _fill(obj, SIZE) + b"]}"


def nested_objects() -> bytes:
    obj = b"{" + b",".join(b'"k%d":{"a":{"b":1}}' % i for i in range(2000)) + b"}"
    return b'{"inputs":[' + _fill(obj, SIZE) + b"]}"


def objects_in_a_known_tensor() -> bytes:  # the right names, junk where the numbers go
    return b'{"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[' + _fill(b"{}", SIZE) + b"]}]}"


def arrays_of_objects_in_parameters() -> bytes:
    return b'{"parameters":{"binary_data_output":[' + _fill(b'{"a":[1]}', SIZE) + b"]},\"inputs\":[]}"


def strings_as_data() -> bytes:
    return b'{"inputs":[{"name":"input","data":[' + _fill(b'"0.5"', SIZE) + b"]}]}"


def many_outputs() -> bytes:
    return b'{"outputs":[' + _fill(b'{"name":"probs","parameters":{"binary_data":true}}', SIZE) + b"]}"


def floats_at_the_size_limit() -> bytes:  # an honest request whose every pixel has all its digits
    n = SIZE // (64 * 24)
    pixels = np.random.default_rng(0).random(n * 64) * 1e-5
    data = ",".join(repr(float(p)) for p in pixels).encode()
    return b'{"inputs":[{"name":"input","shape":[%d,1,8,8],"datatype":"FP64","data":[' % n + data + b"]}]}"


JUNK: dict[str, Callable[[], bytes]] = {f.__name__: f for f in (
    tiny_arrays_in_objects, nested_objects, objects_in_a_known_tensor, arrays_of_objects_in_parameters,
    strings_as_data, many_outputs, floats_at_the_size_limit)}


def _parse(body: bytes) -> object:
    try:
        return payloads.parse_json_object(body, schema=v2.SCHEMA)
    except InputError as exc:
        return exc


def _cpu(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(3):  # the least of three: other processes share the CPU
        gc.collect()
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def _peak(fn: Callable[[], object]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(JUNK))
def test_v2_junk_costs_a_few_times_json_loads_at_most(shape):
    body = JUNK[shape]()
    assert len(body) >= SIZE * 0.8
    result = _parse(body)
    if shape == "floats_at_the_size_limit":
        assert isinstance(result, dict), result  # read whole, as an array
        tensor = result["inputs"][0]
        assert isinstance(tensor["data"], np.ndarray) and tensor["data"].size == np.prod(tensor["shape"])
    else:
        assert isinstance(result, jsonscan.JsonError), result  # refused by the schema, one line
        assert "\n" not in str(result)
    ours, theirs = _cpu(lambda: _parse(body)), _cpu(lambda: json.loads(body))
    assert ours <= CPU_RATIO * theirs, (ours, theirs)
    ours_mem, theirs_mem = _peak(lambda: _parse(body)), _peak(lambda: json.loads(body))
    assert ours_mem <= MEMORY_RATIO * theirs_mem, (ours_mem, theirs_mem)


@pytest.mark.parametrize("shape", sorted(set(JUNK) - {"floats_at_the_size_limit", "many_outputs"}))
def test_v2_junk_is_refused_at_its_first_wrong_token(shape):
    stats: dict[str, int] = {}
    with pytest.raises(jsonscan.JsonError):
        jsonscan.loads(JUNK[shape](), schema=v2.SCHEMA, stats=stats)
    assert stats["values"] <= 12 and stats["bytes"] < 200  # the first wrong token, not the value cap


def test_v2_junk_of_the_right_shape_is_refused_at_the_value_cap():
    stats: dict[str, int] = {}
    with pytest.raises(jsonscan.JsonError, match="values"):
        jsonscan.loads(many_outputs(), schema=v2.SCHEMA, stats=stats)
    assert stats["values"] == jsonscan.MAX_VALUES + 1 and stats["bytes"] < 100 * jsonscan.MAX_VALUES


def test_an_honest_v2_document_fits_the_schema():
    doc = {"id": "r1", "parameters": {"binary_data_output": False, "method": "smoothgrad", "target": [1, 2]},
           "inputs": [{"name": "input", "shape": [2, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 128,
                       "parameters": {"binary_data_size": None}},
                      {"name": "target", "shape": [2], "datatype": "INT64", "data": [1, 2]}],
           "outputs": [{"name": "explanation", "parameters": {"binary_data": True}}]}
    obj = jsonscan.loads(json.dumps(doc).encode(), schema=v2.SCHEMA)
    assert obj["inputs"][0]["data"].shape == (128,) and obj["outputs"][0]["parameters"] == {"binary_data": True}


@pytest.mark.parametrize("shape", sorted(set(JUNK) - {"floats_at_the_size_limit", "many_outputs"}))
def test_the_v2_route_reads_its_body_with_the_schema(shape, monkeypatch):
    """What /v2/models/NAME/infer runs (``parse_infer``) stops at the first wrong token too."""
    real, seen = jsonscan.loads, []

    def watched(*args: object, **kwargs: object) -> object:
        stats: dict[str, int] = {}
        seen.append(stats)
        return real(*args, **kwargs, stats=stats)  # type: ignore[arg-type]

    monkeypatch.setattr(jsonscan, "loads", watched)
    with pytest.raises(InputError):
        v2.parse_infer(None, None, False, JUNK[shape](), None)  # type: ignore[arg-type]  # refused before either
    assert len(seen) == 1 and seen[0]["bytes"] < 200
