"""pyinfra-testing fact fixtures: tests/facts/<module>.<Fact>/*.yaml, one test per file."""

from pathlib import Path

from pyinfra_testing.facts import make_fact_tests

FACTS_TESTS = Path(__file__).parents[1] / "specs" / "facts"

for _fact_name in sorted(d.name for d in FACTS_TESTS.iterdir() if d.is_dir()):
    locals()[_fact_name] = make_fact_tests("facts", _fact_name, FACTS_TESTS / _fact_name)
