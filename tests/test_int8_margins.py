"""The counting behind `experiments.int8_margins` (agreement of the int8 files by the float
net's top-1 margin), against counts worked out by hand."""

import numpy as np

from experiments.int8_margins import EDGES, bin_counts, summarize, top1_margins


def test_margins_are_the_top_probability_minus_the_second():
    probabilities = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.34, 0.33, 0.33]])
    np.testing.assert_allclose(top1_margins(probabilities), [0.2, 0.7, 0.01])


def test_counts_per_bin_hold_edges_on_the_upper_side_and_one_in_the_last_bin():
    assert EDGES == (0.0, 0.05, 0.1, 0.2, 0.5, 1.0)
    margins = np.array([0.0, 0.049, 0.05, 0.15, 0.2, 0.7, 1.0])
    agree = np.array([False, True, False, True, True, False, True])
    # [0, .05): 0.0 (miss), 0.049 (agree); [.05, .1): 0.05 (miss); [.1, .2): 0.15;
    # [.2, .5): 0.2; [.5, 1]: 0.7 (miss), 1.0.
    assert bin_counts(margins, agree) == [[2, 1], [1, 0], [1, 1], [1, 1], [2, 1]]


def test_the_summary_pools_the_nets_and_shares_the_disagreements():
    rows = [
        {"runtime": "onnx", "edges": list(EDGES), "bins": [[4, 2], [0, 0], [0, 0], [0, 0], [6, 6]]},
        {"runtime": "onnx", "edges": list(EDGES), "bins": [[2, 1], [0, 0], [0, 0], [0, 0], [8, 7]]},
    ]
    first, *_, last = summarize(rows)
    assert (first["images"], first["disagreements"]) == (6, 3)
    assert first["agreement"] == 50.0
    assert first["share_of_disagreements"] == 75.0  # 3 of the 4 disagreements
    assert first["per_net"]["mean"] == 50.0
    assert (last["images"], last["disagreements"], last["share_of_disagreements"]) == (14, 1, 25.0)
    assert np.isclose(last["per_net"]["mean"], (100 + 87.5) / 2)
    assert summarize(rows)[1]["agreement"] is None  # no image in the bin


def test_the_page_names_measured_rows_of_other_nets_as_such():
    # A levers / margins / phase row belongs to the study's nets only when its default
    # file's float accuracy is its run's validation accuracy.
    from experiments.transfer_int8 import _nets, of_these_nets

    rows = [
        {"name": "a", "arm": "transfer", "val_accuracy": 0.43},
        {"name": "b", "arm": "transfer", "val_accuracy": 0.70},
        {"name": "backbone", "arm": "backbone", "val_accuracy": 0.85},
    ]
    same = [{"net": "a", "float_accuracy": 0.43}, {"net": "b", "float_accuracy": 0.70}]
    assert of_these_nets(rows, same)
    # Only the default setting's float net is the run's: a phase's own float net may differ.
    assert of_these_nets(rows, [*same, {"net": "a", "setting": "qat", "float_accuracy": 0.5}])
    assert not of_these_nets(rows, [{"net": "a", "float_accuracy": 0.408}])
    assert not of_these_nets(rows, [{"net": "c", "float_accuracy": 0.43}])  # not a run here
    assert _nets(2, True) == "2 of these nets"
    assert _nets(2, False).startswith("2 nets (nets of an earlier run of this plan")
