"""Operator settings from the environment and flags; the entry point's argument handling."""

from __future__ import annotations

import asyncio
import datetime
import logging

import kopf
import pydantic
import pytest
import yaml

from rlightning import contract
from rlightning_operator import OperatorSettings
from rlightning_operator import _handlers as handlers
from rlightning_operator._builders import NetworkPolicyOptions
from rlightning_operator.__main__ import main


def test_defaults():
    settings = OperatorSettings.from_env({})
    assert settings.health_port == contract.OPERATOR_HEALTH_PORT
    assert settings.metrics_port == contract.OPERATOR_METRICS_PORT
    assert settings.served_namespaces == ["default"] and not settings.all_namespaces


def test_environment_and_overrides():
    env = {"RLIGHTNING_OPERATOR_NAMESPACES": "b, a", "RLIGHTNING_OPERATOR_LOG_FORMAT": "json",
           "RLIGHTNING_OPERATOR_METRICS_PORT": "0"}
    settings = OperatorSettings.from_env(env, log_level="DEBUG", health_port=None)
    assert settings.served_namespaces == ["a", "b"]
    assert (settings.log_format, settings.log_level, settings.metrics_port) == ("json", "DEBUG", 0)
    assert OperatorSettings.from_env({"RLIGHTNING_OPERATOR_ALL_NAMESPACES": "true"}).served_namespaces == []


def test_network_policy_switch_and_scrapers_namespace():
    assert OperatorSettings.from_env({}).network_policy_options == NetworkPolicyOptions(metrics_namespace="")
    env = {"RLIGHTNING_OPERATOR_NETWORK_POLICY": "false"}
    assert OperatorSettings.from_env(env).network_policy_options is None
    assert OperatorSettings.from_env(env, network_policy=True).network_policy_options is not None  # the flag wins
    env = {"RLIGHTNING_OPERATOR_NETWORK_POLICY_METRICS_NAMESPACE": "monitoring"}
    assert OperatorSettings.from_env(env).network_policy_options == NetworkPolicyOptions("monitoring")


@pytest.mark.parametrize("env", [
    {"RLIGHTNING_OPERATOR_NETWORK_POLICY_METRICS_NAMESPACE": "Not_A_Namespace"},
    {"RLIGHTNING_OPERATOR_LOG_FORMAT": "xml"},
    {"RLIGHTNING_OPERATOR_HEALTH_PORT": "70000"},
    {"RLIGHTNING_OPERATOR_NAMESPACES": "a", "RLIGHTNING_OPERATOR_ALL_NAMESPACES": "1"},
    {"RLIGHTNING_OPERATOR_WATCH_SERVER_TIMEOUT_SECONDS": "60"},  # not below the client timeout (45)
    {"RLIGHTNING_OPERATOR_WATCH_SERVER_TIMEOUT_SECONDS": "2.5"},  # the API server takes whole seconds
    {"RLIGHTNING_OPERATOR_RENEW_DEADLINE_SECONDS": "15"},  # a standby could act before the holder gives up
    {"RLIGHTNING_OPERATOR_RETRY_PERIOD_SECONDS": "10"},  # no retry before the holder gives up
])
def test_invalid_environment(env):
    with pytest.raises(pydantic.ValidationError):
        OperatorSettings.from_env(env)


def test_leader_election_and_bounds_from_the_environment():
    settings = OperatorSettings.from_env({})
    assert not settings.leader_election
    assert settings.watch_server_timeout_seconds < settings.watch_client_timeout_seconds
    assert settings.retry_period_seconds < settings.renew_deadline_seconds < settings.lease_duration_seconds
    settings = OperatorSettings.from_env({"RLIGHTNING_OPERATOR_LEADER_ELECTION": "true",
                                          "RLIGHTNING_OPERATOR_LEASE_NAMESPACE": "ops"}, leader_election=None)
    assert settings.leader_election and settings.lease_namespace == "ops"


def test_entry_point_rejects_bad_settings(monkeypatch, capsys):
    monkeypatch.setenv("RLIGHTNING_OPERATOR_LOG_FORMAT", "xml")
    assert main([]) == 2
    assert "settings.log_format" in capsys.readouterr().err


def test_json_log_lines_and_quiet_event_handlers():
    import json
    import logging

    from rlightning_operator.__main__ import JsonFormatter, QuietEventHandlers

    record = logging.LogRecord("rlightning_operator._reconcile", logging.INFO, __file__, 1, "created %s", ("x",), None)
    entry = json.loads(JsonFormatter().format(record))
    assert (entry["level"], entry["logger"], entry["message"]) == (
        "INFO", "rlightning_operator._reconcile", "created x"
    )
    noisy = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, "Handler 'group_changed' succeeded.", (), None)
    other = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, "Handler 'reconcile-create' succeeded.", (),
                              None)
    assert not QuietEventHandlers().filter(noisy) and QuietEventHandlers().filter(other)


def test_kopf_holds_at_most_its_watches_and_the_workers_connections(tmp_path, monkeypatch):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "a"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    settings = OperatorSettings.from_env({}, namespaces=["a", "b"], workers=3)

    async def log_in() -> tuple[int, str, str | None]:
        context = await handlers.login(memo=handlers.Context(settings, reconciler=None), logger=logging.getLogger(),
                                       settings=kopf.OperatorSettings(), retry=0, started=datetime.datetime.now(),
                                       runtime=datetime.timedelta(0))
        assert isinstance(context, kopf.AiohttpSession)
        try:
            return context.aiohttp_session.connector.limit, context.server, context.default_namespace
        finally:
            await context.aiohttp_session.close()

    # 4 watched kinds in each of 2 namespaces, the nodes, and one connection per worker for patches and Events
    assert asyncio.run(log_in()) == (4 * 2 + 1 + 3, "https://127.0.0.1:6443", "a")
