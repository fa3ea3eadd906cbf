"""The browser page's test data (pxvm/web/cases.py): every registered op's conformance
cases (pxvm/ops/cases.py) become plans, benchmarks name registered ops, and random pxVM
programs are valid and use every matrix opcode."""

from __future__ import annotations

import numpy as np

from pxvm.ops import REGISTRY
from pxvm.vm import validate_program
from pxvm.web import cases, plans


def test_every_registered_op_has_a_conformance_case():
    assert plans.ops_without_case(REGISTRY) == [], (
        "add cases for these ops to CASES in src/pxvm/ops/cases.py so the page tests them")
    assert set(cases.CASES) <= set(REGISTRY), "a case for an op that is not registered"
    assert set(cases.BENCHMARKS) <= set(REGISTRY)


def test_case_ids_name_every_case_once():
    ids = plans.case_ids()
    assert len(ids) == len(set(ids)) == sum(len(c) for c in cases.CASES.values())
    assert "add" in ids and "add-3" in ids and "add-4" not in ids
    assert all("-" not in name for name in REGISTRY), "'-' separates an op from its case number"


def test_ops_without_case_lists_the_ops_the_table_misses():
    registry = {"add": REGISTRY["add"], "not_an_op": REGISTRY["add"]}
    assert plans.ops_without_case(registry) == ["not_an_op"]
    assert plans.case_ids(registry) == ["add", "add-1", "add-2", "add-3"]


def test_benchmarks_state_their_work():
    for name, case in cases.BENCHMARKS.items():
        plan = plans.benchmark_plan(name)
        assert plan["op"] == name and plan["dispatches"]
        assert plan["flops"] > 0 and plan["bytes"] > 0


def test_random_programs_use_every_matrix_opcode():
    names = {ins.name for ins in validate_program(cases.random_program(7)).instructions}
    assert {"MATMUL_I8", "BIAS_I32", "REQUANT", "RELU_I8", "ARGMAX_I32"} <= names


def test_random_programs_are_reproducible_from_their_seed():
    assert np.array_equal(cases.random_program(11), cases.random_program(11))
    assert not np.array_equal(cases.random_program(11), cases.random_program(12))
