"""orbit_common.service.config: defaults < TOML file < environment; unknown keys are errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from orbit_common.db.pool import INIT_COMMAND, SessionSettings
from orbit_common.service.config import (
    ApiConfig,
    ConfigError,
    DatabaseConfig,
    OrbitConfig,
    load_config,
)


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "orbit.toml"
    path.write_text(text)
    return path


def test_defaults_without_file_or_environment() -> None:
    config = load_config(None, {})
    assert config == OrbitConfig()
    assert config.api.port == 8080
    assert config.api.max_body_bytes == 1024 * 1024
    assert config.database.url == ""


def test_environment_overrides_convert_strings_to_the_key_type() -> None:
    config = load_config(
        None,
        {
            "ORBIT_API_PORT": "9000",
            "ORBIT_API_HOST": "192.0.2.1",
            "ORBIT_DATABASE_POOL_MAX": "30",
            "ORBIT_SERVICE_DRAIN_TIMEOUT_S": "2.5",
            "ORBIT_DATABASE_URL": "mysql://u:p@db/orbit",
            "ORBIT_UNRELATED": "ignored",
        },
    )
    assert config.api.port == 9000
    assert config.api.host == "192.0.2.1"
    assert config.database.pool_max == 30
    assert config.service.drain_timeout_s == 2.5
    assert config.database.url == "mysql://u:p@db/orbit"


def test_the_toml_file_is_read_and_the_environment_wins(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        '[database]\nurl = "mysql://a@h/x"\npool_max = 7\n\n[api]\nport = 1234\nhost = "::"\n',
    )
    config = load_config(path, {"ORBIT_API_PORT": "4321"})
    assert config.database == DatabaseConfig(url="mysql://a@h/x", pool_max=7)
    assert config.api == ApiConfig(port=4321, host="::")


def test_orbit_config_names_the_file_and_an_explicit_path_wins(tmp_path: Path) -> None:
    named = _toml(tmp_path, "[api]\nport = 1111\n")
    other = tmp_path / "other.toml"
    other.write_text("[api]\nport = 2222\n")
    assert load_config(None, {"ORBIT_CONFIG": str(named)}).api.port == 1111
    assert load_config(other, {"ORBIT_CONFIG": str(named)}).api.port == 2222


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[api]\nport = 1\nbogus = 2\n", r"extra fields found \(bogus\) @ \$\.api"),
        ("[apii]\nport = 1\n", r"extra fields found \(apii\) @ \$"),
        ("api = 3\n", r"@ \$\.api"),
        ('[api]\nport = "x"\n', r"expected int @ \$\.api\.port"),
        ("[api]\nport = 1.9\n", r"expected int @ \$\.api\.port"),
        ("[api]\nport = true\n", r"expected int @ \$\.api\.port"),
        ("[api]\nhost = 1\n", r"expected str @ \$\.api\.host"),
        ('[service]\ndrain_timeout_s = "soon"\n', r"expected float @ \$\.service\.drain_timeout_s"),
        ("[service]\ndrain_timeout_s = false\n", r"expected float @ \$\.service\.drain_timeout_s"),
    ],
)
def test_unknown_keys_and_wrong_types_in_the_file_are_errors(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(_toml(tmp_path, text), {})


@pytest.mark.parametrize(
    ("name", "value", "path"),
    [
        ("ORBIT_API_PORT", "abc", r"\$\.api\.port"),
        ("ORBIT_API_PORT", "80.5", r"\$\.api\.port"),
        ("ORBIT_API_MAX_BODY_BYTES", "1MiB", r"\$\.api\.max_body_bytes"),
        ("ORBIT_SERVICE_DRAIN_TIMEOUT_S", "forever", r"\$\.service\.drain_timeout_s"),
    ],
)
def test_a_bad_number_in_the_environment_is_an_error(name: str, value: str, path: str) -> None:
    with pytest.raises(ConfigError, match=f"invalid configuration: .* @ {path}"):
        load_config(None, {name: value})


def test_an_unreadable_or_invalid_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.toml", {})
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(_toml(tmp_path, "[api\nport = 1\n"), {})


def test_database_parsed_requires_a_url() -> None:
    with pytest.raises(ConfigError, match="no database configured"):
        DatabaseConfig().parsed()
    assert DatabaseConfig(url="mysql://u@h/d").parsed().database == "d"


def test_the_database_url_is_not_in_the_repr() -> None:
    config = load_config(None, {"ORBIT_DATABASE_URL": "mysql://u:hunter2@h/d"})
    assert "hunter2" not in repr(config)


def test_an_empty_environment_variable_counts_as_unset(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[database]\nurl = "mysql://u:p@db/from_file"\n')
    config = load_config(path, {"ORBIT_DATABASE_URL": "", "ORBIT_API_PORT": ""})
    assert config.database.url == "mysql://u:p@db/from_file"
    assert config.api.port == 8080


def test_daemon_sessions_bound_lock_waits_and_idle_transactions() -> None:
    defaults = load_config(None, {}).database.session()
    assert defaults == SessionSettings(lock_wait_timeout_s=2, idle_transaction_timeout_s=1)
    assert "innodb_lock_wait_timeout = 2" in defaults.init_command()
    # MariaDB runs the executable comment, MySQL skips it (docs/runbooks/liveness.md).
    assert defaults.init_command().endswith(
        " /*M!100300 , idle_transaction_timeout = 1 */")
    off = load_config(None, {"ORBIT_DATABASE_IDLE_TRANSACTION_TIMEOUT_S": "0",
                             "ORBIT_DATABASE_LOCK_WAIT_TIMEOUT_S": "5"}).database.session()
    assert "idle_transaction_timeout" not in off.init_command()
    assert "innodb_lock_wait_timeout = 5" in off.init_command()
    # Tools and tests keep the plain settings.
    assert "idle_transaction_timeout" not in INIT_COMMAND


@pytest.mark.parametrize(("name", "value"), [("ORBIT_DATABASE_LOCK_WAIT_TIMEOUT_S", "0"),
                                             ("ORBIT_DATABASE_IDLE_TRANSACTION_TIMEOUT_S", "-1")])
def test_out_of_range_session_limits_are_errors(name: str, value: str) -> None:
    config = load_config(None, {name: value})
    with pytest.raises(ConfigError, match="invalid \\[database\\] setting"):
        config.database.session()


def test_the_credential_check_interval_is_a_positive_number_of_seconds() -> None:
    assert load_config(None, {}).dispatcher.credential_check_s == 5.0
    config = load_config(None, {"ORBIT_DISPATCHER_CREDENTIAL_CHECK_S": "0.5"})
    assert config.dispatcher.credential_check_s == 0.5
    with pytest.raises(ConfigError,
                       match=r"'credential_check_s' must be > 0: 0.0 @ \$\.dispatcher"):
        load_config(None, {"ORBIT_DISPATCHER_CREDENTIAL_CHECK_S": "0"})


@pytest.mark.parametrize(("value", "expected"), [("false", False), ("0", False), ("OFF", False),
                                                 ("true", True), ("1", True), ("yes", True)])
def test_per_tenant_metric_labels_are_a_boolean_from_the_environment(
    value: str, expected: bool
) -> None:
    config = load_config(None, {"ORBIT_SERVICE_METRICS_TENANT_LABELS": value})
    assert config.service.metrics_tenant_labels is expected


def test_per_tenant_metric_labels_default_on_and_read_from_the_file(tmp_path: Path) -> None:
    assert load_config(None, {}).service.metrics_tenant_labels is True
    path = _toml(tmp_path, "[service]\nmetrics_tenant_labels = false\nmetrics_port = 9180\n")
    service = load_config(path, {}).service
    assert (service.metrics_tenant_labels, service.metrics_port) == (False, 9180)


@pytest.mark.parametrize("text", ['[service]\nmetrics_tenant_labels = "maybe"\n',
                                  "[service]\nmetrics_tenant_labels = 1\n"])
def test_a_tenant_labels_value_that_is_not_a_boolean_is_an_error(
    tmp_path: Path, text: str
) -> None:
    with pytest.raises(ConfigError, match=r"\$\.service\.metrics_tenant_labels"):
        load_config(_toml(tmp_path, text), {})


def test_the_pump_settings_come_from_the_environment_and_are_checked() -> None:
    config = load_config(None, {"ORBIT_DELIVERY_LEASE_BATCH": "20",
                                "ORBIT_DELIVERY_CIRCUIT_OPEN_S": "2.5",
                                "ORBIT_DELIVERY_METRICS_TENANT_LABELS": "yes"})
    assert config.delivery.lease_batch == 20
    assert config.delivery.circuit_open_s == 2.5
    assert config.delivery.metrics_tenant_labels is True
    assert load_config(None, {}).delivery.metrics_tenant_labels is False  # no tenant names
    for bad in ({"ORBIT_DELIVERY_LEASE_BATCH": "501"}, {"ORBIT_DELIVERY_TIMEOUT_S": "0"},
                {"ORBIT_DELIVERY_CIRCUIT_FAILURE_THRESHOLD": "0"}):
        with pytest.raises(ConfigError):
            load_config(None, bad)


def test_the_engine_round_settings_come_from_the_environment_and_are_checked() -> None:
    defaults = load_config(None, {}).weave
    assert (defaults.rounds_in_flight, defaults.recover_interval_s) == (1, 1.0)
    config = load_config(None, {"ORBIT_WEAVE_ROUNDS_IN_FLIGHT": "3",
                                "ORBIT_WEAVE_RECOVER_INTERVAL_S": "0"})
    assert (config.weave.rounds_in_flight, config.weave.recover_interval_s) == (3, 0.0)
    for bad in ({"ORBIT_WEAVE_ROUNDS_IN_FLIGHT": "0"}, {"ORBIT_WEAVE_ROUNDS_IN_FLIGHT": "17"},
                {"ORBIT_WEAVE_RECOVER_INTERVAL_S": "-1"}):
        with pytest.raises(ConfigError):
            load_config(None, bad)
