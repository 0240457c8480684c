"""operations.weights against pyinfra-testing fixtures (tests/specs/op_weights/<op>/*.yaml): the
op's branches, commands and no-op messages from given fact values, in ms."""

from pathlib import Path

from pyinfra_testing.operations import make_operation_tests

SPECS = Path(__file__).parents[1] / "specs" / "op_weights"

TestSnapshot = make_operation_tests("operations", "weights.downloaded", SPECS / "weights.downloaded")
