"""The real InfluxDB and Mosquitto that the other tests, the benchmarks and the demo run against."""

from __future__ import annotations

import queue
import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.client import Client, ConnectFlags, DisconnectFlags, MQTTMessage
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from gpuprobe.devservices import (
    BinaryNotFoundError,
    InfluxDBDatabase,
    InfluxDBError,
    InfluxDBServer,
    MosquittoServer,
    StartError,
)

WAIT_S = 10.0

# --- InfluxDB ------------------------------------------------------------------------------------------


def test_line_protocol_round_trip_is_exact(influxdb: InfluxDBDatabase) -> None:
    # A measurement and tag values with escaped commas and spaces, a float that is not exact in binary,
    # an integer above 2**53 (where a float would round), a string with quotes, a boolean.
    influxdb.write_lines(
        "gpu\\,stats,host=node\\ 1,gpu=a\\,b "
        'power_w=0.1,energy_mj=9007199254740993i,state="throttled \\"hot\\"",ok=true,temp_c=2.0 '
        "1700000000000000001"
    )

    series = influxdb.query('SELECT * FROM "gpu,stats"')

    assert [s.name for s in series] == ["gpu,stats"]
    assert series[0].columns == ("time", "energy_mj", "gpu", "host", "ok", "power_w", "state", "temp_c")
    row = series[0].rows()[0]
    assert row == {
        "time": 1700000000000000001,
        "energy_mj": 9007199254740993,
        "gpu": "a,b",
        "host": "node 1",
        "ok": True,
        "power_w": 0.1,
        "state": 'throttled "hot"',
        "temp_c": 2,
    }
    assert type(row["energy_mj"]) is int
    assert type(row["power_w"]) is float
    # InfluxDB's JSON writes a float field with an integral value without a decimal point.
    assert type(row["temp_c"]) is int


def test_group_by_tags_come_back_as_series_tags(influxdb: InfluxDBDatabase) -> None:
    influxdb.write_lines(["m,gpu=0 w=1i 1", "m,gpu=1 w=2i 2", "m,gpu=1 w=3i 3"])

    series = influxdb.query('SELECT sum("w") FROM "m" GROUP BY "gpu"')

    assert [(dict(s.tags), s.values) for s in series] == [
        ({"gpu": "0"}, ((0, 1),)),
        ({"gpu": "1"}, ((0, 5),)),
    ]


def test_field_type_conflict_raises_with_influxdbs_message(influxdb: InfluxDBDatabase) -> None:
    influxdb.write_lines("m,gpu=0 power_w=250i 1")

    with pytest.raises(InfluxDBError) as caught:
        influxdb.write_lines("m,gpu=0 power_w=250.5 2")

    assert caught.value.status == 400
    assert "field type conflict" in caught.value.message
    assert 'input field "power_w" on measurement "m" is type float, already exists as type integer' in str(caught.value)


def test_query_error_raises(influxdb: InfluxDBDatabase) -> None:
    with pytest.raises(InfluxDBError, match="error parsing query"):
        influxdb.query("SELEC * FROM m")
    with pytest.raises(InfluxDBError, match="database not found"):
        influxdb.server.query("no_such_database_here", "SELECT * FROM m")


def test_each_test_gets_a_fresh_database(influxdb: InfluxDBDatabase) -> None:
    assert influxdb.name in influxdb.server.databases()
    assert influxdb.server.execute("SHOW MEASUREMENTS", db=influxdb.name) == []


def test_kill9_and_start_on_the_same_port_keeps_the_data(tmp_path: Path) -> None:
    # A private server: this test kills it.
    with InfluxDBServer(tmp_path / "influxdb") as server:
        port, url = server.port, server.url
        server.create_database("telemetry")
        server.write_lines("telemetry", "gpu,host=a power_w=251.5,energy_mj=12i 1700000000000000000")
        old_pid = server.pid

        server.kill()

        assert not server.running
        assert server.returncode == -signal.SIGKILL
        assert not server.ping()
        with pytest.raises(InfluxDBError) as caught:
            server.write_lines("telemetry", "gpu,host=a power_w=1 1700000000000000001")
        assert caught.value.status is None  # no answer: the server is down

        server.start()

        assert (server.port, server.url) == (port, url)
        assert server.pid != old_pid
        rows = server.query("telemetry", "SELECT * FROM gpu")[0].rows()
        assert rows == [{"time": 1700000000000000000, "energy_mj": 12, "host": "a", "power_w": 251.5}]


def test_a_taken_automatic_port_is_replaced_on_first_start(tmp_path: Path) -> None:
    server = InfluxDBServer(tmp_path / "influxdb")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", server.port))
        squatter.listen()
        taken = server.port
        with server:
            assert server.port != taken
            assert server.ping()


def test_a_taken_explicit_port_fails_with_the_log_tail(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        server = InfluxDBServer(tmp_path / "influxdb", port=port)

        with pytest.raises(StartError) as caught:
            server.start()

    assert "address already in use" in caught.value.log_tail
    assert str(server.log_path) in str(caught.value)
    assert not server.running


@pytest.mark.parametrize(
    ("make", "package"),
    [
        (lambda d: InfluxDBServer(d, binary=d / "no-such-influxd"), "influxdb"),
        (lambda d: MosquittoServer(d, binary=d / "no-such-mosquitto"), "mosquitto"),
        (lambda d: MosquittoServer(d, users={"u": "p"}, passwd_binary=d / "no-such-passwd"), "mosquitto"),
    ],
    ids=["influxd", "mosquitto", "mosquitto_passwd"],
)
def test_a_missing_binary_says_how_to_install_it(tmp_path: Path, make: Any, package: str) -> None:
    server: InfluxDBServer | MosquittoServer = make(tmp_path)

    with pytest.raises(BinaryNotFoundError, match=f"apt-get install {package}.*make test"):
        server.start()

    assert not server.running


# --- MQTT ----------------------------------------------------------------------------------------------


class SyncClient:
    """A paho client running its network loop in a thread, with the events it saw in queues."""

    def __init__(self, port: int, *, username: str | None = None, password: str | None = None) -> None:
        self.port = port
        self.client = Client(CallbackAPIVersion.VERSION2, client_id=f"test-{uuid.uuid4().hex[:8]}")
        if username is not None:
            self.client.username_pw_set(username, password)
        self.client.reconnect_delay_set(min_delay=1, max_delay=1)
        self.connacks: queue.Queue[ReasonCode] = queue.Queue()
        self.disconnects: queue.Queue[ReasonCode] = queue.Queue()
        self.subacks: queue.Queue[list[ReasonCode]] = queue.Queue()
        self.messages: queue.Queue[MQTTMessage] = queue.Queue()
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message

    def connect(self) -> ReasonCode:
        self.client.connect("127.0.0.1", self.port, keepalive=10)
        self.client.loop_start()
        return self.connacks.get(timeout=WAIT_S)

    def subscribe(self, topic: str) -> None:
        self.client.subscribe(topic, qos=1)
        assert not any(code.is_failure for code in self.subacks.get(timeout=WAIT_S))

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(timeout=WAIT_S)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _on_connect(
        self, client: Client, userdata: Any, flags: ConnectFlags, code: ReasonCode, props: Properties | None
    ) -> None:
        self.connacks.put(code)

    def _on_disconnect(
        self,
        client: Client,
        userdata: Any,
        flags: DisconnectFlags,
        code: ReasonCode,
        props: Properties | None,
    ) -> None:
        self.disconnects.put(code)

    def _on_subscribe(
        self, client: Client, userdata: Any, mid: int, codes: list[ReasonCode], props: Properties | None
    ) -> None:
        self.subacks.put(codes)

    def _on_message(self, client: Client, userdata: Any, message: MQTTMessage) -> None:
        self.messages.put(message)


@pytest.fixture
def clients() -> Iterator[list[SyncClient]]:
    """A list a test appends its clients to, so each is closed even when the test fails."""
    made: list[SyncClient] = []
    yield made
    for client in made:
        client.close()


def _client(clients: list[SyncClient], port: int, **credentials: str) -> SyncClient:
    client = SyncClient(port, **credentials)
    clients.append(client)
    return client


def test_publish_subscribe_round_trip(mqtt_broker: MosquittoServer, clients: list[SyncClient]) -> None:
    topic = f"gpuprobe/test/{uuid.uuid4().hex}/probe"
    subscriber = _client(clients, mqtt_broker.port)
    publisher = _client(clients, mqtt_broker.port)
    assert subscriber.connect() == 0
    assert publisher.connect() == 0
    subscriber.subscribe(topic)

    publisher.publish(topic, b'{"gpu": 0, "power_w": 251.5}')

    message = subscriber.messages.get(timeout=WAIT_S)
    assert (message.topic, message.payload, message.retain) == (topic, b'{"gpu": 0, "power_w": 251.5}', False)


def test_a_retained_message_reaches_a_later_subscriber(mqtt_broker: MosquittoServer, clients: list[SyncClient]) -> None:
    topic = f"gpuprobe/test/{uuid.uuid4().hex}/status"
    publisher = _client(clients, mqtt_broker.port)
    assert publisher.connect() == 0
    publisher.publish(topic, b"online", retain=True)

    late = _client(clients, mqtt_broker.port)
    assert late.connect() == 0
    late.subscribe(topic)

    message = late.messages.get(timeout=WAIT_S)
    assert (message.topic, message.payload, message.retain) == (topic, b"online", True)
    publisher.publish(topic, b"", retain=True)  # clear it on the shared broker


def test_a_broker_with_users_refuses_a_wrong_password(tmp_path: Path, clients: list[SyncClient]) -> None:
    with MosquittoServer(tmp_path / "mosquitto", users={"agent": "s3cret", "probe": "other"}) as broker:
        assert broker.password_file is not None
        assert "s3cret" not in broker.password_file.read_text()  # hashed

        wrong = _client(clients, broker.port, username="agent", password="wrong")
        anonymous = _client(clients, broker.port)
        right = _client(clients, broker.port, username="agent", password="s3cret")

        assert wrong.connect() == "Not authorized"
        assert anonymous.connect() == "Not authorized"
        assert right.connect() == "Success"


def test_a_client_reconnects_after_the_broker_restarts_on_the_same_port(
    tmp_path: Path, clients: list[SyncClient]
) -> None:
    # A private broker: this test stops it.
    with MosquittoServer(tmp_path / "mosquitto") as broker:
        port = broker.port
        client = _client(clients, port)
        assert client.connect() == 0

        broker.stop()
        client.disconnects.get(timeout=WAIT_S)
        assert broker.returncode == 0  # a graceful stop
        broker.start()

        assert broker.port == port
        assert client.connacks.get(timeout=WAIT_S) == 0  # paho's loop reconnected by itself
        topic = f"gpuprobe/test/{uuid.uuid4().hex}"
        client.subscribe(topic)
        other = _client(clients, port)
        assert other.connect() == 0
        other.publish(topic, b"after restart")
        assert client.messages.get(timeout=WAIT_S).payload == b"after restart"
