"""Write deploy/monitoring/prometheusrule.yaml (the PrometheusRule that prometheus-operator
loads) from deploy/monitoring/rules.yaml (the rule file promtool checks and tests): the rules
have one source, and tests/test_monitoring.py checks that the two agree.

    python -m deploy.monitoring.render [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules.yaml"
PROMETHEUS_RULE = HERE / "prometheusrule.yaml"

HEADER = """\
# Generated from rules.yaml by `python -m deploy.monitoring.render`: edit rules.yaml, not this.
# kube-prometheus-stack loads a PrometheusRule only when its labels match the Prometheus'
# ruleSelector (by default release: <helm release name>): add that label here if yours is set
# that way.
"""


def prometheus_rule(rules_text: str) -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "ocrfleet", "namespace": "ocrfleet",
                     "labels": {"app.kubernetes.io/part-of": "ocrfleet",
                                "app.kubernetes.io/component": "monitoring"}},
        "spec": {"groups": yaml.safe_load(rules_text)["groups"]},
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as literal blocks, as in rules.yaml."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def render() -> str:
    return HEADER + yaml.dump(prometheus_rule(RULES.read_text()), Dumper=_Dumper,
                              sort_keys=False, width=120)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if PROMETHEUS_RULE.read_text() != text:
            print(f"{PROMETHEUS_RULE} is out of date: python -m deploy.monitoring.render",
                  file=sys.stderr)
            return 1
        return 0
    PROMETHEUS_RULE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
