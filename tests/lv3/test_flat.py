from __future__ import annotations

import numpy as np
import pytest

from meta.lv3 import FlatBuffer


def arrays() -> dict[str, np.ndarray]:
    return {"w": np.arange(6.0).reshape(2, 3), "b": np.array([7.0, 8.0]), "s": np.array(9.0)}


def test_layout_and_views() -> None:
    flat = FlatBuffer.like(arrays())
    assert flat.buffer.shape == (9,) and flat.buffer.dtype == np.float64 and len(flat) == 9
    assert list(flat.views) == ["w", "b", "s"]
    assert {k: v.shape for k, v in flat.views.items()} == {"w": (2, 3), "b": (2,), "s": ()}
    for view in flat.views.values():
        assert np.shares_memory(view, flat.buffer)
    assert flat.pack(arrays()) is flat.buffer
    np.testing.assert_array_equal(flat.buffer, np.arange(10.0)[[0, 1, 2, 3, 4, 5, 7, 8, 9]])
    np.testing.assert_array_equal(flat.views["w"], arrays()["w"])


def test_unpack_into_writes_in_place() -> None:
    flat = FlatBuffer.like(arrays())
    flat.pack(arrays())
    flat.buffer *= 2
    target = {k: np.zeros_like(v) for k, v in arrays().items()}
    kept = dict(target)
    flat.unpack_into(target)
    for name, value in arrays().items():
        assert target[name] is kept[name]
        np.testing.assert_array_equal(target[name], 2 * value)


def test_explicit_shapes_and_casting() -> None:
    flat = FlatBuffer({"a": (2,), "b": (1, 1)}, np.float32)
    flat.pack({"a": np.array([1.0, 2.0]), "b": np.ones((1, 1))})  # float64 -> float32
    assert flat.buffer.dtype == np.float32
    np.testing.assert_array_equal(flat.buffer, [1, 2, 1])
    assert len(FlatBuffer.like({})) == 0


def test_errors_name_the_key() -> None:
    flat = FlatBuffer.like(arrays())
    with pytest.raises(KeyError, match=r"missing \['b'\]"):
        flat.pack({k: v for k, v in arrays().items() if k != "b"})
    with pytest.raises(KeyError, match=r"unexpected \['extra'\]"):
        flat.unpack_into({**arrays(), "extra": np.zeros(1)})
    with pytest.raises(ValueError, match=r"'w' has shape \(3, 2\), the buffer holds \(2, 3\)"):
        flat.pack({**arrays(), "w": np.zeros((3, 2))})


def test_dtype_errors() -> None:
    with pytest.raises(TypeError, match="w: float64, b: float32"):
        FlatBuffer.like({"w": np.zeros(2), "b": np.zeros(2, dtype=np.float32)})
    with pytest.raises(TypeError, match="float type, got int64"):
        FlatBuffer.like({"n": np.zeros(2, dtype=np.int64)})


def test_adopt_into_given_memory() -> None:
    """``adopt(into=...)`` lays the arrays out in memory the caller owns (a shared window)."""
    memory = np.full(9, -1.0)
    params = arrays()
    flat = FlatBuffer.adopt(params, into=memory)
    assert flat.buffer is memory and np.shares_memory(params["w"], memory)
    np.testing.assert_array_equal(params["w"], arrays()["w"])
    params["b"] += 1
    assert memory[6:8].tolist() == [8.0, 9.0]
    with pytest.raises(ValueError, match=r"the given buffer is float32\[9\], the arrays need "
                                         r"float64\[9\]"):
        FlatBuffer.adopt(arrays(), into=np.zeros(9, np.float32))
