"""The trimmed add-on builds: the switch keeps exactly the chosen triggers, and the examples use only those."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from devcluster import _trim

REPO = pathlib.Path(__file__).resolve().parents[2]

SOURCE = """package scaling

func buildScaler(triggerType string) (Scaler, error) {
	// TRIGGERS-START
	switch triggerType {
	case "activemq":
		return NewActiveMQScaler()
	case "cpu":
		return NewCPUMemoryScaler("cpu")
	case "kafka":
		return NewKafkaScaler()
	case "metrics-api":
		return NewMetricsAPIScaler()
	default:
		return nil, fmt.Errorf("no scaler found for type: %s", triggerType)
	}
	// TRIGGERS-END
}
"""


def test_the_switch_keeps_the_chosen_cases_and_the_default():
    trimmed = _trim.trim_switch(SOURCE, ("cpu", "metrics-api"))

    assert 'case "cpu":' in trimmed and 'case "metrics-api":' in trimmed
    assert "activemq" not in trimmed and "Kafka" not in trimmed
    assert "no scaler found" in trimmed
    assert trimmed.count("{") == trimmed.count("}")  # the switch and the function still close
    assert trimmed.startswith("package scaling") and trimmed.endswith("// TRIGGERS-END\n}\n")


@pytest.mark.parametrize(
    ("source", "keep", "problem"),
    [
        (SOURCE.replace("// TRIGGERS-START", ""), ("cpu",), "no // TRIGGERS-START"),
        (SOURCE, ("cpu", "prometheus"), "no case prometheus"),
        (SOURCE.replace("\tdefault:", '\tcase "x":'), ("cpu",), "last arm is not its default"),
    ],
)
def test_an_upstream_that_moved_fails_by_name(source, keep, problem):
    with pytest.raises(_trim.TrimError, match=problem):
        _trim.trim_switch(source, keep)


def test_every_keda_trigger_in_the_examples_is_built():
    used = {
        trigger["type"]
        for path in sorted((REPO / "examples").rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "ScaledObject"
        for trigger in doc["spec"]["triggers"]
    }

    assert used and used <= set(_trim.KEDA.keep_cases)
