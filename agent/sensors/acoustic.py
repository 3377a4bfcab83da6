"""Part: agent. Microphone levels: IEC 61672-1 A-weighting, 1 s LAeq and fast (125 ms) LAF, through sounddevice.

Signal chain (``LevelMeter``), for a mono stream of samples ``x`` in full-scale units (1.0 = full scale):

1. A-weighting: the analog prototype of IEC 61672-1:2013 Annex E (poles at f1 = 20.598997 Hz
   (double), f2 = 107.65265 Hz, f3 = 737.86223 Hz, f4 = 12194.217 Hz (double), normalised to 0 dB at
   1 kHz with A1000 = 1.9997 dB), digitised with ``scipy.signal.bilinear`` at the stream's rate and
   run as second-order sections.
2. ``LAeq`` over each 1 s window: ``10·log10(mean(x_A²)) + C``.
3. ``LAF``: the squared signal through a one-pole low-pass with τ = 0.125 s
   (``y[n] = a·y[n-1] + (1-a)·x_A²[n]``, ``a = exp(-1/(fs·τ))``), read at the end of each window:
   ``10·log10(y) + C``.

``C`` is the calibration offset in dB (``--mic-calibration-db``): the level in dB SPL of a signal
whose mean square is 1 (full scale). Calibrate it with a 94 dB, 1 kHz calibrator:
``C = 94 - 10·log10(mean(x²))`` of the calibrator's recording, or from a datasheet as
``C = 94 - sensitivity (dBFS rms)``.

``Microphone`` gets blocks of 125 ms from PortAudio's callback thread and runs the meter there (about
1 ms of CPU per second of audio). A device that delivers samples faster than real time (a
file-backed ALSA PCM) is paced to the wall clock in the callback, so one window is one second.
Where PortAudio or the device is missing the microphone is disabled with one log line; the proxy
keeps running.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# IEC 61672-1:2013 Annex E, the constants of the analog A-weighting prototype
F1_HZ = 20.598997
F2_HZ = 107.65265
F3_HZ = 737.86223
F4_HZ = 12194.217
A1000_DB = 1.9997
FAST_TAU_S = 0.125


def a_weighting_sos(fs_hz: float) -> Any:
    """Second-order sections of the digital A-weighting filter at sample rate ``fs_hz``."""
    import numpy as np
    from scipy import signal

    w1, w2, w3, w4 = (2 * math.pi * f for f in (F1_HZ, F2_HZ, F3_HZ, F4_HZ))
    numerator = [w4**2 * 10 ** (A1000_DB / 20), 0.0, 0.0, 0.0, 0.0]
    denominator = np.polymul(
        np.polymul([1.0, 2 * w4, w4**2], [1.0, 2 * w1, w1**2]),
        np.polymul([1.0, w3], [1.0, w2]),
    )
    b, a = signal.bilinear(numerator, denominator, fs_hz)
    return signal.tf2sos(b, a)


def a_weighting_db(f_hz: float) -> float:
    """The analog A-weighting response in dB at ``f_hz`` (IEC 61672-1 eq. E.6), for checks."""
    f2 = f_hz * f_hz
    r = (F4_HZ**2 * f2 * f2) / ((f2 + F1_HZ**2) * math.sqrt((f2 + F2_HZ**2) * (f2 + F3_HZ**2)) * (f2 + F4_HZ**2))
    return 20 * math.log10(r) + A1000_DB


@dataclass(frozen=True)
class Levels:
    """One completed window: its end (agent clock, ns) and its levels in dB."""

    time_unix_ns: int
    laeq_db: float
    laf_db: float


class LevelMeter:
    """Turns a stream of samples into one (LAeq, LAF) pair per ``window_s`` of samples."""

    def __init__(self, fs_hz: int, calibration_db: float, window_s: float = 1.0, tau_s: float = FAST_TAU_S) -> None:
        import numpy as np
        from scipy import signal

        self._np = np
        self._signal = signal
        self.fs_hz = fs_hz
        self.calibration_db = calibration_db
        self.window_samples = max(1, round(fs_hz * window_s))
        self._sos = a_weighting_sos(fs_hz)
        self._zi = np.zeros((self._sos.shape[0], 2))
        self._alpha = math.exp(-1.0 / (fs_hz * tau_s))
        self._fast_ms = 0.0  # the time-weighted mean square
        self._sum_sq = 0.0
        self._count = 0

    def _db(self, mean_square: float) -> float:
        return 10 * math.log10(max(mean_square, 1e-30)) + self.calibration_db

    def process(self, x: Any) -> list[tuple[float, float]]:
        """Feed samples; returns (laeq_db, laf_db) for every window completed by them."""
        np = self._np
        weighted, self._zi = self._signal.sosfilt(self._sos, np.asarray(x, dtype=np.float64), zi=self._zi)
        squared = weighted * weighted
        alpha = self._alpha
        fast, _ = self._signal.lfilter([1 - alpha], [1, -alpha], squared, zi=[alpha * self._fast_ms])
        done: list[tuple[float, float]] = []
        start = 0
        n = len(squared)
        while start < n:
            take = min(n - start, self.window_samples - self._count)
            end = start + take
            self._sum_sq += float(squared[start:end].sum())
            self._count += take
            if self._count == self.window_samples:
                done.append((self._db(self._sum_sq / self._count), self._db(float(fast[end - 1]))))
                self._sum_sq = 0.0
                self._count = 0
            start = end
        if n:
            self._fast_ms = float(fast[-1])
        return done


class Microphone:
    """A capture device read by PortAudio's callback thread; completed windows wait in :meth:`drain`."""

    def __init__(self, device: str, calibration_db: float, samplerate_hz: int = 48000) -> None:
        self.device = device
        self.calibration_db = calibration_db
        self.samplerate_hz = samplerate_hz
        self._windows: collections.deque[Levels] = collections.deque(maxlen=120)
        self._stopping = False
        self._stream: Any = None
        self._meter: LevelMeter | None = None
        self._started_mono = 0.0
        self._frames = 0

    def start(self) -> bool:
        """Open the device; False (after one log line) when PortAudio or the device is missing."""
        try:
            import sounddevice
        except OSError as e:
            log.warning(
                "microphone disabled: PortAudio is not available (%s; install libportaudio2); "
                "acoustic values come from the proxy only",
                e,
            )
            return False
        try:
            self._meter = LevelMeter(self.samplerate_hz, self.calibration_db)
            self._stream = sounddevice.InputStream(
                device=self.device,
                channels=1,
                samplerate=self.samplerate_hz,
                dtype="float32",
                blocksize=max(1, self.samplerate_hz // 8),
                callback=self._callback,
                finished_callback=self._finished,
            )
            self._started_mono = time.monotonic()
            self._stream.start()
        except Exception as e:  # sounddevice raises ValueError / PortAudioError for missing devices
            log.warning(
                "microphone disabled: cannot open input device %r (%s); acoustic values come from the proxy only",
                self.device,
                e,
            )
            self._stream = None
            return False
        log.info(
            "microphone: %r at %d Hz, calibration offset %.2f dB", self.device, self.samplerate_hz, self.calibration_db
        )
        return True

    def _callback(self, indata: Any, frames: int, _time: Any, _status: Any) -> None:
        assert self._meter is not None
        for laeq, laf in self._meter.process(indata[:, 0]):
            self._windows.append(Levels(time.time_ns(), laeq, laf))
        self._frames += frames
        # a device that delivers faster than real time (a file-backed ALSA PCM) is paced to the wall
        # clock here; a real microphone is never ahead, so this never sleeps for one
        ahead_s = self._started_mono + self._frames / self.samplerate_hz - time.monotonic()
        if ahead_s > 0 and not self._stopping:
            time.sleep(min(ahead_s, 1.0))

    def _finished(self) -> None:
        if not self._stopping:
            log.error("microphone %r stopped; acoustic values come from the proxy only", self.device)

    def drain(self) -> list[Levels]:
        out: list[Levels] = []
        while self._windows:
            out.append(self._windows.popleft())
        return out

    def stop(self) -> None:
        self._stopping = True
        if self._stream is not None:
            try:
                self._stream.abort()
                self._stream.close()
            except Exception:
                pass
            self._stream = None
            log.info("microphone %r: capture stopped", self.device)
