"""Real InfluxDB and Mosquitto servers on free ports, for tests, benchmarks and the demo."""

from gpuprobe.devservices.errors import BinaryNotFoundError, DevServiceError, StartError
from gpuprobe.devservices.influxdb import InfluxDBDatabase, InfluxDBError, InfluxDBServer, Series
from gpuprobe.devservices.mosquitto import MosquittoServer, mqtt_connack
from gpuprobe.devservices.ports import free_port, free_ports

__all__ = [
    "BinaryNotFoundError",
    "DevServiceError",
    "InfluxDBDatabase",
    "InfluxDBError",
    "InfluxDBServer",
    "MosquittoServer",
    "Series",
    "StartError",
    "free_port",
    "free_ports",
    "mqtt_connack",
]
