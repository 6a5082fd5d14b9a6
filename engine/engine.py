"""The engine: voices, the scheduler and the runner behind one small API for transports.

Transports call ``open_stream`` (whole text or text to come), read the
stream's events, and cancel it when their client leaves. Everything else —
which step runs when, batching, admission — is the scheduler's business, and
the engine loop (``engine/core.py``) drives it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from rtvoice.engine.audio.resample import SUPPORTED_SAMPLE_RATES
from rtvoice.engine.core import CallDeadlines, EngineCore
from rtvoice.engine.errors import InvalidRequest, ModelNotLoaded
from rtvoice.engine.metrics import Metrics
from rtvoice.engine.models.base import SynthesisOptions, Voice, VoiceInfo
from rtvoice.engine.runner import ModelRunner
from rtvoice.engine.scheduler import Limits, Scheduler
from rtvoice.engine.settings import EngineSettings
from rtvoice.engine.stream import SpeechStream
from rtvoice.engine.text import Segmenter, is_speakable
from rtvoice.engine.voices import VoiceRegistry

if TYPE_CHECKING:
    from rtvoice.engine.models.cosyvoice2.service import CosyVoice2Service

log = logging.getLogger(__name__)

T = TypeVar("T")


class Engine:
    def __init__(self, settings: EngineSettings, voices: VoiceRegistry | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self._voices = voices
        self.runner = ModelRunner(settings.runner_threads, cost_scale=settings.model_cost_scale)
        self.scheduler = Scheduler(
            self.runner.slots,
            Limits(
                max_active_streams=settings.max_active_streams,
                max_queued_streams=settings.max_queued_streams,
                max_batch_size=settings.max_batch_size,
                max_load=settings.max_load,
                cost_safety=settings.cost_safety_factor,
                idle_cores_for_first_audio=settings.idle_cores_for_first_audio,
            ),
            self.metrics,
        )
        self.core = EngineCore(
            self.scheduler,
            self.runner,
            CallDeadlines(settings.model_call_deadline_factor, settings.model_call_deadline_max_s),
        )
        self.metrics.calls_running.set_function(lambda: len(self.scheduler.running))
        self.metrics.abandoned_threads.set_function(lambda: self.runner.abandoned_threads)
        self.ready = False

    async def start(self) -> None:
        """Load and warm the voices (off the event loop), then start scheduling."""
        loop = asyncio.get_running_loop()
        if self._voices is None:
            self._voices = await loop.run_in_executor(None, VoiceRegistry.load, self.settings)
        if self.settings.warmup:
            await loop.run_in_executor(None, self._voices.warmup)
            await self.core.calibrate(self._voices.all())
        for voice in self._voices.all():
            self.scheduler.watch(voice)
        self.core.start()
        self.ready = True
        log.info("engine ready with voices %s", ", ".join(self._voices.ids()))

    async def stop(self) -> None:
        self.ready = False
        await self.core.stop()
        self.runner.close()

    # -- voices -----------------------------------------------------------------------------------

    @property
    def voices(self) -> VoiceRegistry:
        if self._voices is None:
            raise RuntimeError("engine not started")
        return self._voices

    def voice_infos(self) -> list[VoiceInfo]:
        return self.voices.infos()

    def resolve_voice(self, name: str | None, param: str = "voice") -> Voice:
        return self.voices.resolve(name, param)

    @property
    def cosyvoice(self) -> CosyVoice2Service:
        """The loaded CosyVoice2 model; ModelNotLoaded (503) when the server runs without one."""
        service = self.voices.cosyvoice
        if service is None:
            raise ModelNotLoaded(
                "no CosyVoice2 model is loaded on this server; start it with RTVOICE_COSYVOICE_DIR set to a "
                "CosyVoice2 model directory",
                code="model_not_loaded",
            )
        return service

    # -- requests ---------------------------------------------------------------------------------

    def check_text(self, text: str, param: str) -> None:
        """Raise InvalidRequest for text that is empty, unspeakable or too long."""
        if not text or not text.strip():
            raise InvalidRequest(f"'{param}' is empty", code="empty_input", param=param)
        if len(text) > self.settings.max_text_chars:
            raise InvalidRequest(
                f"'{param}' has {len(text)} characters; the limit is {self.settings.max_text_chars}",
                code="input_too_long",
                param=param,
            )
        if not is_speakable(text):
            raise InvalidRequest(
                f"'{param}' has nothing to speak (no letters or digits)", code="empty_input", param=param
            )

    def check_sample_rate(self, sample_rate: int | None, param: str = "sample_rate") -> None:
        if sample_rate is not None and sample_rate not in SUPPORTED_SAMPLE_RATES:
            raise InvalidRequest(
                f"unsupported sample rate {sample_rate}; supported: {', '.join(map(str, SUPPORTED_SAMPLE_RATES))}",
                code="unsupported_sample_rate",
                param=param,
            )

    def check_options(self, use: Callable[[SynthesisOptions], T], options: SynthesisOptions, param: str = "speed") -> T:
        """``use(options)``, or InvalidRequest naming ``param`` when it raises ValueError for options a voice
        cannot honour. ``use``: a voice's ``validate`` or ``open_session``, or a model's rule checked before
        its voice exists."""
        try:
            return use(options)
        except ValueError as error:
            raise InvalidRequest(str(error), code="invalid_value", param=param) from error

    def open_stream(
        self,
        voice: Voice,
        options: SynthesisOptions = SynthesisOptions(),
        sample_rate: int | None = None,
        text: str | None = None,
        trim_leading_silence: bool = False,
    ) -> SpeechStream:
        """Admit a new stream; with ``text`` its input is complete, without it the caller pushes text.
        ``trim_leading_silence`` drops the voice's silence before its first sound (a live player's delay).

        Raises InvalidRequest for options the voice cannot honour and Overloaded past the limits.
        """
        self.check_sample_rate(sample_rate)
        session = self.check_options(voice.open_session, options)
        segmenter = Segmenter.of(self.settings, voice.info.language)
        stream = SpeechStream(
            voice,
            session,
            segmenter,
            sample_rate or voice.info.sample_rate,
            self.core.wake,
            max_buffered_s=self.settings.max_buffered_audio_s,
            clock=self.scheduler.clock,
            on_end=self.scheduler.stream_ended,
            trim_leading_silence=trim_leading_silence,
        )
        if text is not None:  # before admission, which weighs how much audio it asks for
            stream.push_text(text)
            stream.close_input()
        self.scheduler.admit(stream)
        self.core.wake()
        return stream
