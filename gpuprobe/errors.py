"""Part: core. The one exception tree of gpuprobe: every exception class gpuprobe defines derives from
:class:`GpuprobeError` through one of four kinds, so a caller can catch by kind (``except
ConfigError``) or everything of gpuprobe's (``except GpuprobeError``). A class keeps the built-in base
it had before the tree (``ValueError``, ``RuntimeError``, ``LookupError``), because code catches some
of them as such; the kinds add no built-in base of their own, except :class:`ConfigError`, which
every class of its kind already was (a ``ValueError``).

This module imports nothing of gpuprobe's, so any module can import it. The tree, each class with its
module (``gpuprobe.`` left out; ``agent/…`` is ``gpuprobe.agent``) and when it is raised::

    GpuprobeError                              errors.py: the root; never raised itself
    ├── ConfigError (ValueError)               errors.py, re-exported by config.py: a bad option
    │   │                                      value, config file or key; the message names the option
    │   │                                      and where its value came from
    │   ├── CollectorConfigError               collector/settings.py: collector settings that cannot
    │   │                                      work (alone or together), found when it starts
    │   ├── AuthConfigError                    collector/auth.py: the tokens file or the TLS files
    │   │                                      cannot be used
    │   ├── IdentityError                      agent/identity.py: an identity label (--host, --cluster,
    │   │                                      ...) that cannot be a tag or a topic segment
    │   ├── KeyFileError                       control/keys.py: an operator key file that is missing,
    │   │                                      unreadable or not an Ed25519 key
    │   ├── TopicError                         control/topics.py: a host name or id that cannot be an
    │   │                                      MQTT topic segment (an option, or an id in a command)
    │   ├── UnknownProfileError                sim/profiles.py: an unknown GPU profile or a bad --set
    │   ├── InitDbError                        influx/retention.py: --init-db cannot set up the database
    │   │                                      (unreachable, not an admin, a bad policy name)
    │   └── DeviceError                        trainer/device.py: the --device asked for is not here
    ├── ServiceError                           errors.py: a part cannot start or keep running
    │   ├── SpoolError (RuntimeError)          agent/spool.py: the spool directory cannot be used (not
    │   │   │                                  writable, or another running agent holds it)
    │   │   └── SpoolDiskFull                  agent/spool.py: no room for a batch on the spool's disk
    │   ├── WalError (RuntimeError)            collector/wal.py: the WAL cannot be opened or written
    │   ├── GpuSensorError (RuntimeError)      nvml/errors.py: NVML cannot be used at all (no
    │   │                                      library, no driver); the agent runs without GPUs
    │   ├── NvmlCallError (RuntimeError)       nvml/errors.py: one NVML call outside the sampler
    │   │                                      failed (a trainer's clock read, a power limit set)
    │   ├── NativeSamplerError (RuntimeError)  nvml/errors.py: the native GPU sampler cannot be built,
    │   │                                      loaded or started (the message says how to build it)
    │   ├── SimStateError (RuntimeError)       sim/state.py: no simulated machine, or a bad one, in a
    │   │                                      state directory
    │   ├── SimBuildError (RuntimeError)       sim/build.py: the simulator library cannot be compiled
    │   ├── Cancelled                          trainer/run.py: a training run was asked to stop
    │   │                                      (SIGTERM, SIGINT, a probe cancel); the run catches it
    │   ├── DemoError (RuntimeError)           app/demo.py: a step of `gpuprobe demo` failed
    │   └── DevServiceError (RuntimeError)     devservices/errors.py: a development InfluxDB or
    │       │                                  Mosquitto cannot be used
    │       ├── BinaryNotFoundError            devservices/errors.py: the server's executable is not
    │       │                                  installed
    │       ├── StartError                     devservices/errors.py: the server exited during start
    │       │                                  or did not become ready in time
    │       └── _AddressInUse                  devservices/_process.py: the server's port was taken
    │                                          during its start (the start is retried on new ports)
    ├── ProtocolError                          errors.py: a wire or control contract violated
    │   ├── StreamError                        wire/validate.py: ends an agent's telemetry stream
    │   │                                      with a gRPC status (docs/wire.md)
    │   ├── SessionError                       agent/uplink.py: ends one uplink session to a collector
    │   ├── Refusal                            control/signing.py: an agent refuses a probe command,
    │   │                                      with the reason of docs/control.md
    │   ├── PowerLimitRefused                  control/powerlimit.py: an agent will not or cannot set
    │   │                                      a probe's GPU power limit (the reason says why)
    │   └── BadMessage (ValueError)            agent/trainer_input.py: a trainer socket line outside
    │                                          its contract (dropped and logged)
    └── DataError                              errors.py: bad input data, or an unusable answer to a
        │                                      query
        ├── UnrepresentableError (ValueError)  influx/lineprotocol.py: a name or value that line
        │                                      protocol cannot carry exactly
        ├── InfluxError (RuntimeError)         influx/influxql.py: InfluxDB refused a request or a
        │                                      statement, or could not be reached
        ├── NoDataError (LookupError)          model/data.py: the probe or time range has no data
        ├── FittedError (ValueError)           model/predict.py: a fitted JSON that holds no usable model
        ├── BadRow                             importer/formats.py: a log row that cannot be imported
        │                                      (counted and reported by reason, not fatal)
        └── FormatError (ValueError)           importer/formats.py: a log that is neither format, or a
                                               column mapping that does not fit it

``tests/test_errors.py`` checks the tree against the code.
"""

from __future__ import annotations


class GpuprobeError(Exception):
    """Every exception gpuprobe defines derives from this class, through one of the kinds below."""


class ConfigError(GpuprobeError, ValueError):
    """A bad option value, file or key; the message names where the value came from."""


class ServiceError(GpuprobeError):
    """A part of gpuprobe cannot start or keep running (its spool, WAL, NVML, a service it needs)."""


class ProtocolError(GpuprobeError):
    """A peer broke the wire or control contract (docs/wire.md, docs/control.md)."""


class DataError(GpuprobeError):
    """Input data that cannot be stored, or an answer to a query that cannot be used."""
