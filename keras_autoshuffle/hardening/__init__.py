"""Hardening: rounding each learned shuffle to an exact permutation (the paper's last step).

- `harden_model`, `harden_and_evaluate`, `format_hardening_report` (`harden.py`);
- plain rounding is `permutations.nearest_permutation` (linear assignment);
- balanced rounding with prescribed g x g block counts (`balanced.py`) and its
  ShuffleNet v2 form (`balanced_v2.py`), for networks that fold as cheaply as manual;
- what a hardened shuffle is, its routing counts, and how far they are from the manual
  shuffle's (`canonical.py`).
"""

from keras_autoshuffle.hardening.balanced import nearest_balanced_permutation
from keras_autoshuffle.hardening.balanced_v2 import nearest_balanced_v2_permutation
from keras_autoshuffle.hardening.canonical import (
    routing_counts,
    routing_difference,
    v2_stage_counts,
)
from keras_autoshuffle.hardening.harden import (
    format_hardening_report,
    harden_and_evaluate,
    harden_model,
    shuffle_groups,
)

__all__ = [
    "format_hardening_report",
    "harden_and_evaluate",
    "harden_model",
    "nearest_balanced_permutation",
    "nearest_balanced_v2_permutation",
    "routing_counts",
    "routing_difference",
    "shuffle_groups",
    "v2_stage_counts",
]
