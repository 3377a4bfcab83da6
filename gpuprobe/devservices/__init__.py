"""Part: devservices. Real InfluxDB, Mosquitto and Prometheus servers on free ports, for tests, benchmarks and the
demo."""

from gpuprobe.devservices.errors import BinaryNotFoundError, DevServiceError, StartError
from gpuprobe.devservices.influxdb import InfluxDBDatabase, InfluxDBError, InfluxDBServer, Series
from gpuprobe.devservices.mosquitto import MosquittoServer, mqtt_connack
from gpuprobe.devservices.ports import free_port, free_ports
from gpuprobe.devservices.prometheus import PrometheusServer

__all__ = [
    "BinaryNotFoundError",
    "DevServiceError",
    "InfluxDBDatabase",
    "InfluxDBError",
    "InfluxDBServer",
    "MosquittoServer",
    "PrometheusServer",
    "Series",
    "StartError",
    "free_port",
    "free_ports",
    "mqtt_connack",
]
