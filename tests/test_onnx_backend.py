"""ONNX's own node conformance suite, driven through ``meta.lv1.onnx_backend`` by
``onnx.backend.test.BackendTest`` exactly as it drives onnxruntime.

Every node case shipped in the installed onnx wheel runs on the CPU device, except those
matched by ``EXCLUDE``: each pattern with the reason meta fails it. That dict is the documented
list of gaps; ``tools/onnx_node_suite.py`` prints the pass counts of meta (and of onnxruntime
when it is installed). Remove a pattern once its cases pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.backend.test
import pytest
from onnx import TensorProto, helper

from meta.lv1.onnx_backend import MetaBackend

NARROW = ("numpy has no dtype for float8, float4, int4, int2 or bfloat16: meta computes in "
          "numpy dtypes (and widens such initializers to float32 on import)")

EXCLUDE: dict[str, str] = {
    # -- types numpy lacks --------------------------------------------------------------------
    r"^test_cast_(no_saturate_)?FLOAT(16)?_to_(FLOAT8|FLOAT4|U?INT4|U?INT2|BFLOAT16)": NARROW,
    (r"^test_castlike_(no_saturate_)?FLOAT(16)?_to_(FLOAT8|FLOAT4|U?INT4|U?INT2|BFLOAT16)"
     r"\w*_expanded_cpu$"): NARROW + " (the expanded form runs Cast to that type)",
    r"^test_cast_e8m0_FLOAT(16)?_to_FLOAT8E8M0_cpu$": NARROW + " (FLOAT8E8M0 with round_mode)",
    r"_bf16_expanded_cpu$": NARROW,
    r"^test_attention_\w+_bf16_cpu$": NARROW,
    r"^test_quantizelinear_(e4m3fn|e5m2|float4e2m1|u?int2|u?int4)_cpu$": NARROW,
    r"^test_unique_bfloat16_sorted_without_axis_cpu$": NARROW,
    r"^test_range_bfloat16_type_positive_delta_expanded_cpu$": NARROW,
    r"^test_einsum_(sum|batch_matmul)_bfloat16_cpu$": NARROW + " (np.einsum refuses bfloat16)",
    # -- values that are not tensors ----------------------------------------------------------
    # -- loader limits and known operator gaps ------------------------------------------------
    r"^test_not_[234]d_": "the case imports default-domain opset 1; meta/lv1/onnx_io.py reads "
        "opsets from 7 (MIN_OPSET), pinned by tests/lv1/test_onnx_import.py",
    r"^test_convtranspose_output_shape_": "ops/conv_transpose.py refuses an output_shape larger "
        "than the full output (negative total padding); ONNX extends the output instead",
    # -- operators meta does not implement (yet) ----------------------------------------------
    r"^(test_ai_onnx_ml_array_feature_extractor)_cpu$":
        "ArrayFeatureExtractor (ai.onnx.ml) is not implemented in meta (used inside these cases' "
        "graphs)",
    r"^test_bernoulli_?(|double|seed)_cpu$": "Bernoulli (ai.onnx) is not implemented in meta",
    r"^(test_ai_onnx_ml_binarizer)_cpu$":
        "Binarizer (ai.onnx.ml) is not implemented in meta (these cases' graphs use it)",
    (r"^(test_basic_deform_conv_with_padding|test_basic_deform_conv_without_padding|"
     r"test_deform_conv_with_mask_bias|test_deform_conv_with_multiple_offset_groups)_cpu$"):
        "DeformConv (ai.onnx) is not implemented in meta (these cases' graphs use it)",
    (r"^test_flexattention_?(|causal_mask|diff_head_sizes|double|fp16|gqa|prob_mod|"
     r"relative_positional|scaled|score_mod|soft_cap)_cpu$"):
        "FlexAttention (ai.onnx.preview) is not implemented in meta",
    (r"^(test_image_decoder_decode_bmp_rgb|test_image_decoder_decode_jpeg2k_rgb|"
     r"test_image_decoder_decode_jpeg_bgr|test_image_decoder_decode_jpeg_grayscale|"
     r"test_image_decoder_decode_jpeg_rgb|test_image_decoder_decode_png_rgb|"
     r"test_image_decoder_decode_pnm_rgb|test_image_decoder_decode_tiff_rgb|"
     r"test_image_decoder_decode_webp_rgb)_cpu$"):
        "ImageDecoder (ai.onnx) is not implemented in meta (these cases' graphs use it)",
    (r"^(test_ai_onnx_ml_label_encoder_string_int|"
     r"test_ai_onnx_ml_label_encoder_string_int_no_default|"
     r"test_ai_onnx_ml_label_encoder_tensor_mapping|"
     r"test_ai_onnx_ml_label_encoder_tensor_value_only_mapping)_cpu$"):
        "LabelEncoder (ai.onnx.ml) is not implemented in meta (these cases' graphs use it)",
    r"^test_loop16_seq_none_cpu$": "onnx's runner cannot compare a sequence of 0-d tensors "
        "(assert_similar_outputs takes len() of each scalar); meta's output is right",
    r"^test_melweightmatrix_?()_cpu$": "MelWeightMatrix (ai.onnx) is not implemented in meta",
    r"^(test_bernoulli_double_expanded|test_bernoulli_expanded|test_bernoulli_seed_expanded)_cpu$":
        "RandomUniformLike (ai.onnx) is not implemented in meta (these cases' graphs use it)",
    (r"^(test_regex_full_match_basic|test_regex_full_match_email_domain|"
     r"test_regex_full_match_empty)_cpu$"):
        "RegexFullMatch (ai.onnx) is not implemented in meta (these cases' graphs use it)",
    (r"^(test_string_concat|test_string_concat_broadcasting|test_string_concat_empty_string|"
     r"test_string_concat_utf8|test_string_concat_zero_dimensional)_cpu$"):
        "StringConcat (ai.onnx) is not implemented in meta (these cases' graphs use it)",
    (r"^(test_strnormalizer_export_monday_casesensintive_lower|"
     r"test_strnormalizer_export_monday_casesensintive_nochangecase|"
     r"test_strnormalizer_export_monday_casesensintive_upper|"
     r"test_strnormalizer_export_monday_empty_output|"
     r"test_strnormalizer_export_monday_insensintive_upper_twodim|"
     r"test_strnormalizer_nostopwords_nochangecase)_cpu$"):
        "StringNormalizer (ai.onnx) is not implemented in meta (these cases' graphs use it)",
    (r"^(test_string_split_basic|test_string_split_consecutive_delimiters|"
     r"test_string_split_empty_string_delimiter|test_string_split_empty_tensor|"
     r"test_string_split_maxsplit|test_string_split_no_delimiter)_cpu$"):
        "StringSplit (ai.onnx) is not implemented in meta (these cases' graphs use it)",
    (r"^test_tfidfvectorizer_?(tf_batch_onlybigrams_skip0|tf_batch_onlybigrams_skip5|"
     r"tf_batch_uniandbigrams_skip5|tf_only_bigrams_skip0|tf_onlybigrams_levelempty|"
     r"tf_onlybigrams_skip5|tf_uniandbigrams_skip5)_cpu$"):
        "TfIdfVectorizer (ai.onnx) is not implemented in meta",
    (r"^(test_ai_onnx_ml_tree_ensemble_set_membership|"
     r"test_ai_onnx_ml_tree_ensemble_single_tree)_cpu$"):
        "TreeEnsemble (ai.onnx.ml) is not implemented in meta (these cases' graphs use it)",
}

# The model suites (simple, pytorch-converted, pytorch-operator, and the "light" copies of the
# real models): BackendTest skips a model meta's is_compatible refuses, so every refusal must be
# listed here, and test_model_suite_gaps_are_exactly_these checks that the list is exact.
MODEL_GAPS: dict[str, str] = {
    "test_gradient_of_add": "ai.onnx.preview.training Gradient is not implemented",
    "test_gradient_of_add_and_mul": "ai.onnx.preview.training Gradient is not implemented",
    **{f"test_strnorm_model_{name}": "StringNormalizer: meta has no string tensors"
       for name in ("monday_casesensintive_lower", "monday_casesensintive_nochangecase",
                    "monday_casesensintive_upper", "monday_empty_output",
                    "monday_insensintive_upper_twodim", "nostopwords_nochangecase")},
}

_suite = onnx.backend.test.BackendTest(MetaBackend, __name__)
_suite.include(r"_cpu$")
for _pattern in EXCLUDE:
    _suite.exclude(_pattern)
_cases = _suite.test_cases

# The node cases as a unittest.TestCase class pytest collects: one test per case.
OnnxBackendNodeModelTest = pytest.mark.slow(_cases["OnnxBackendNodeModelTest"])
OnnxBackendSimpleModelTest = _cases["OnnxBackendSimpleModelTest"]
OnnxBackendPyTorchConvertedModelTest = _cases["OnnxBackendPyTorchConvertedModelTest"]
OnnxBackendPyTorchOperatorModelTest = _cases["OnnxBackendPyTorchOperatorModelTest"]
OnnxBackendRealModelTest = _cases["OnnxBackendRealModelTest"]  # the light models: no download


def test_model_suite_gaps_are_exactly_these():
    data = Path(onnx.__file__).parent / "backend" / "test" / "data"
    refused = set()
    for kind in ("simple", "pytorch-converted", "pytorch-operator", "real"):
        for case in sorted(p for p in (data / kind).iterdir() if p.is_dir()):
            model = case / "model.onnx"
            if kind == "real":  # a light model: data.json names the local file
                model = data.parents[3] / json.loads((case / "data.json").read_text())["url"]
            if not MetaBackend.is_compatible(onnx.load(str(model))):
                refused.add(case.name)
    assert refused == set(MODEL_GAPS), (sorted(refused - set(MODEL_GAPS)),
                                        sorted(set(MODEL_GAPS) - refused))


def test_every_exclusion_has_a_reason():
    for pattern, reason in EXCLUDE.items():
        assert pattern.startswith("^") or pattern.endswith("$"), pattern
        assert len(reason) > 20, (pattern, reason)


def test_run_node_and_prepare():
    x = np.array([[-1.0, 2.0]], np.float32)
    (y,) = MetaBackend.run_node(helper.make_node("Relu", ["x"], ["y"]), [x])
    np.testing.assert_array_equal(y, [[0.0, 2.0]])
    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rep = MetaBackend.prepare(model)
    np.testing.assert_array_equal(rep.run([x]).y, -x)
    np.testing.assert_array_equal(rep.run({"x": x})[0], -x)
    np.testing.assert_array_equal(MetaBackend.run_model(model, [x])[0], -x)
    assert MetaBackend.supports_device("CPU") and not MetaBackend.supports_device("CUDA")
    assert MetaBackend.is_compatible(model)


def test_an_unsupported_model_is_not_compatible_and_fails_to_prepare():
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    assert not MetaBackend.is_compatible(model)
    with pytest.raises(Exception, match="Frobnicate"):
        MetaBackend.prepare(model)
