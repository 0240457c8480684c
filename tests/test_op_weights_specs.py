"""operations.weights against pyinfra-testing fixtures (tests/op_weights_specs/<op>/*.yaml): the
op's branches, commands and no-op messages from given fact values, in ms."""

from pathlib import Path

from pyinfra_testing.operations import make_operation_tests

SPECS = Path(__file__).parent / "op_weights_specs"

TestSnapshot = make_operation_tests("operations", "weights.snapshot", SPECS / "weights.snapshot")
