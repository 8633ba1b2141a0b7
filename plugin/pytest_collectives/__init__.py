"""pytest-collectives: run tests on every rank of a real torch.distributed process group.

The public API: what the project's suites, the docs' examples and a user's own tests and backend modules
import, always from here (``from pytest_collectives import examples, refuses``). Everything under the
subpackages is internal and may move; ``tests/test_layout.py`` holds the suites and the docs to this list.
A name is imported on first use, so loading the plugin (and every rank process) pulls in only what it
needs, and no part of the package imports another through here.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> (module under pytest_collectives, attribute)
_PUBLIC: dict[str, tuple[str, str]] = {
    # writing distributed tests
    **{n: ("execution.examples", n) for n in ("examples", "refused_example", "sweep")},
    **{
        n: ("execution.suite_api", n)
        for n in (
            "item_parameter",
            "item_world_sizes",
            "outcome_on_ranks",
            "run_on_ranks",
            "settings_of",
            "survives_a_crash",
        )
    },
    "world_sizes_of": ("execution.collection", "world_sizes_of"),
    "write_reproduction": ("execution.reproductions", "write_reproduction"),
    **{
        n: ("conformance.standalone", n)
        for n in (
            "FailingCall", "backend_modules", "exceptional_script", "group_call_script", "layout_script",
            "point_to_point_script", "work_script",
        )  # fmt: skip
    },
    "share": ("execution.ipc", "share"),
    # algorithms under test, and the exact references they are held to
    "algorithm": ("algorithms.registry", "algorithm"),
    "algorithm_named": ("algorithms.registry", "get"),
    **{
        n: ("algorithms.collectives", n)
        for n in (
            "all_gather_single",
            "all_reduce_direct",
            "all_reduce_reduce_broadcast",
            "all_reduce_reduce_scatter_all_gather",
            "gemm_reduce_scatter",
            "gemm_reduce_scatter_sequential",
            "naive_ring_all_reduce",
            "reduce_scatter_single",
            "ring_all_reduce",
            "ring_reduce_scatter",
        )
    },
    **{
        n: ("algorithms.reference", n)
        for n in (
            "Values",
            "assert_reduced_close",
            "assert_written_within",
            "placed",
            "rank_input",
            "real_dtype",
            "reduce_op",
        )
    },
    # a backend's declarations (its backend module)
    **{
        n: ("backend_declarations", n)
        for n in ("clean_after_a_raise", "declare", "keeps_state_after_a_raise", "refuses")
    },
    "backend_env_preset": ("execution.configurations", "backend_env_preset"),
    # conformance: what the backend supports, the cases drawn, the properties checked
    "active_capabilities": ("conformance.capabilities", "active"),
    **{
        n: ("conformance.capabilities", n)
        for n in ("DTYPES", "EXCEPTIONAL", "NO_OP", "REDUCE_OPS", "REDUCTIONS", "kinds", "refusal")
    },
    **{
        n: ("conformance.cases", n)
        for n in (
            "Calls",
            "Case",
            "DENSE",
            "EDGE_SIZES",
            "FLOATS",
            "LARGE_SIZES",
            "MAX_RANKS",
            "assert_moved",
            "assert_unchanged",
            "cases",
            "complement",
            "every_cell",
            "group_of",
            "laid_out",
            "large",
            "movements",
            "of_the_algorithm",
            "reductions",
            "registered",
            "sentinel",
            "supported_cells",
            "tiers_at",
        )
    },
    **{
        n: ("conformance.properties", n)
        for n in (
            "all_gather_list_matches_reference",
            "all_gather_matches_reference",
            "all_reduce_matches_reference",
            "all_to_all_matches_reference",
            "broadcast_matches_reference",
            "check_splits",
            "gather_matches_reference",
            "gemm_reduce_scatter_matches_reference",
            "matches_reference",
            "reduce_matches_reference",
            "reduce_scatter_list_matches_reference",
            "reduce_scatter_matches_reference",
            "run_all_reduce",
            "scatter_matches_reference",
        )
    },
    "subgroup_members": ("conformance.properties", "members"),
    "rotation_turn": ("conformance.rotation", "turn"),
    "probed": ("conformance.probing", "probed"),
    # the backend's behaviour beyond its results: a mismatch between ranks, and the training stacks
    "MISMATCH_KINDS": ("conformance.mismatches", "KINDS"),
    "MISMATCH_OPERATIONS": ("conformance.mismatches", "OPERATIONS"),
    "MISMATCH_DEADLINE_S": ("conformance.mismatches", "DEADLINE_S"),
    "mismatch_world_size": ("conformance.mismatches", "world_size_for"),
    "call_with_a_mismatch": ("conformance.mismatches", "call"),
    "mismatch_behaviour": ("conformance.mismatches", "behaviour"),
    "record_mismatch": ("conformance.mismatches", "record"),
    "healthy_sum": ("conformance.mismatches", "healthy_sum"),
    "FSDP2": ("conformance.training.stacks", "FSDP2"),
    "FULL_SHAPE": ("conformance.training.redistribute", "FULL_SHAPE"),
    "FUNCTIONAL_CALLS": ("conformance.training.functional", "FUNCTIONAL_CALLS"),
    "FunctionalCall": ("conformance.training.functional", "FunctionalCall"),
    "REDISTRIBUTE": ("conformance.training.redistribute", "REDISTRIBUTE"),
    "Redistribution": ("conformance.training.stacks", "Redistribution"),
    "STACKS": ("conformance.training.stacks", "STACKS"),
    "TENSOR_PARALLEL": ("conformance.training.stacks", "TENSOR_PARALLEL"),
    "first_difference": ("conformance.training.models", "first_difference"),
    "training_record": ("conformance.training.models", "training_record"),
    "full_tensor": ("conformance.training.redistribute", "full_tensor"),
    "functional_results": ("conformance.training.functional", "functional_results"),
    "mesh_shape": ("conformance.training.meshes", "mesh_shape"),
    "placements": ("conformance.training.redistribute", "placements"),
    "tiny_model": ("conformance.training.models", "tiny_model"),
    "train": ("conformance.training.models", "train"),
    "TRAINING_BOUNDS": ("conformance.training.models", "BOUNDS"),
    "training_mesh": ("conformance.training.meshes", "mesh"),
    "distributed_tensor": ("conformance.training.redistribute", "distributed"),
    "missing_api": ("conformance.training.stacks", "missing"),
    # benchmarks: timing inside the workers, message sizes
    **{n: ("bench.timing", n) for n in ("format_size", "measure", "parse_size")},
    "size_sweep": ("bench.timing", "sweep"),
    "Stamps": ("bench.stamps", "Stamps"),
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module 'pytest_collectives' has no attribute {name!r}") from None
    found = importlib.import_module(f"pytest_collectives.{module}")
    value = getattr(found, attribute)
    globals()[name] = value  # later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
