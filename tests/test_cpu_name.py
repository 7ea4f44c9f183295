"""`finetuning.metrics.cpu_name` / `describe_cpu`: the CPU named with the x86 features
that change float and int8 speed (rows of two machines of one model name differ)."""

import os

from keras_autoshuffle.finetuning.metrics import cpu_name, describe_cpu


def test_the_name_carries_the_speed_features_among_the_flags():
    flags = ["sse4_2", "avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"]
    assert describe_cpu("AMD EPYC", flags) == "AMD EPYC (AVX-512 VNNI BF16)"
    assert describe_cpu("AMD EPYC", ["avx2"]) == "AMD EPYC (no AVX-512)"
    assert describe_cpu("Intel Core", ["avx2", "avx_vnni"]) == "Intel Core (no AVX-512 AVX-VNNI)"
    assert describe_cpu("Intel Xeon", ["avx512f", "amx_int8"]) == "Intel Xeon (AVX-512 AMX)"
    assert describe_cpu("Apple M2", None) == "Apple M2"  # flags unknown: the name alone


def test_this_machines_name_is_never_empty_and_names_its_features_on_x86_linux():
    name = cpu_name()
    assert name
    flags = None
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.split(":")[0].strip() == "flags"]
        flags = lines[0].split(":", 1)[1].split() if lines else None
    if flags is not None:
        assert name.endswith(")") and ("no AVX-512" in name) == ("avx512f" not in flags)
