"""The engine: voices, the scheduler and the runner behind one small API for transports (its facade).

Transports map their protocol onto a ``SynthesisRequest`` and call ``open_stream`` with it (whole text or text to
come), read the stream's events, and cancel it when their client leaves. The engine checks every request there,
once. Everything else (which step runs when, batching, admission) is the scheduler's business, and the engine loop
(``engine/core.py``) drives it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from rtvoice.engine import cloning
from rtvoice.engine.audio.resample import SUPPORTED_SAMPLE_RATES
from rtvoice.engine.core import CallDeadlines, EngineCore
from rtvoice.engine.errors import InvalidRequest, ModelNotLoaded
from rtvoice.engine.lexicon import Lexicon
from rtvoice.engine.lexicon_store import LexiconInfo, LexiconStore, UnknownLexicon
from rtvoice.engine.markup import MarkupError
from rtvoice.engine.metrics import Metrics
from rtvoice.engine.models.base import SynthesisOptions, Voice, VoiceInfo
from rtvoice.engine.models.cosyvoice2 import info as cosyvoice2
from rtvoice.engine.plan import Pause, Speech
from rtvoice.engine.request import Recording, SynthesisRequest, read_recording
from rtvoice.engine.runner import ModelRunner
from rtvoice.engine.scheduler import Limits, Scheduler
from rtvoice.engine.settings import EngineSettings
from rtvoice.engine.ssml import MarkupRules, invalid_ssml, read_plan
from rtvoice.engine.stream import SpeechStream, TextLimit
from rtvoice.engine.text import Segmenter, is_speakable
from rtvoice.engine.voices import VoiceRegistry

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class StreamCounts:
    active: int
    """Admitted and not finished."""
    queued: int
    """Waiting for room."""


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
        startup = [Path(path.strip()) for path in settings.lexicons.split(",") if path.strip()]
        self.lexicons = LexiconStore(settings.data_dir / "lexicons", startup)
        self.ready = False

    async def start(self) -> None:
        """Load and warm the voices (off the event loop), then start scheduling."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.lexicons.load)
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
        cloning.sync_registered(self.voices)  # replicas sharing the voices directory register and delete too
        return self.voices.infos()

    @property
    def default_voice_id(self) -> str:
        return self.voices.default_id

    def voice_aliases(self) -> dict[str, str]:
        """Other names for voices (OpenAI's voice names, ``RTVOICE_OPENAI_VOICE_MAP``) and the ids they name."""
        return self.voices.aliases

    def voice_info(self, name: str | None, param: str = "voice", unknown_is_default: bool = False) -> VoiceInfo:
        """The voice a request naming ``name`` speaks with (UnknownVoice naming ``param`` when there is none)."""
        return self._resolve(name, param, unknown_is_default).info

    def find_voice(self, voice_id: str) -> VoiceInfo | None:
        """The voice with exactly this id (no alias), or None."""
        cloning.sync_voice(self.voices, voice_id)
        voice = self.voices.get(voice_id)
        return None if voice is None else voice.info

    def _resolve(self, name: str | None, param: str, unknown_is_default: bool) -> Voice:
        if name:
            cloning.sync_voice(self.voices, name)
        if name and name not in self.voices and f"{cosyvoice2.SPEAKER_PREFIX}{name}" in self.voices:
            name = f"{cosyvoice2.SPEAKER_PREFIX}{name}"  # a spk2info speaker by the bare name CosyVoice's clients use
        if name and unknown_is_default and name not in self.voices:
            log.warning("voice %r not found; using the default voice", name)
            name = None
        return self.voices.resolve(name, param)

    def check_new_voice(self, voice_id: str, prompt_text: str) -> None:
        """Whether a voice may be registered under ``voice_id`` with this transcript (checked before its recording
        is read): ModelNotLoaded, InvalidRequest or Conflict otherwise."""
        cloning.cloning_service(self.voices)
        cloning.check_voice_id(self.voices, voice_id)
        self._check_text(prompt_text, "prompt_text")

    async def register_voice(
        self,
        voice_id: str,
        recording: Recording,
        prompt_text: str,
        *,
        name: str = "",
        language: str = "mul",
        description: str = "",
        param: str = "prompt_wav",
    ) -> VoiceInfo:
        """A zero-shot voice from a recording and its transcript, kept across restarts and served as ``voice_id``."""
        self.check_new_voice(voice_id, prompt_text)
        audio = await read_recording(recording)
        return await cloning.register_voice(
            self.voices,
            voice_id,
            audio,
            prompt_text,
            name=name,
            language=language,
            description=description,
            param=param,
        )

    async def delete_voice(self, voice_id: str) -> None:
        """Remove a registered voice (Conflict for any other); streams speaking with it finish."""
        await cloning.delete_voice(self.voices, voice_id)

    # -- lexicons ----------------------------------------------------------------------------------

    async def add_lexicon(self, data: bytes, name: str = "", param: str = "file") -> LexiconInfo:
        """A PLS lexicon uploaded at run time, kept across restarts; requests name it by its id."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: self.lexicons.add(data, name, param=param))

    def lexicon_infos(self) -> list[LexiconInfo]:
        return self.lexicons.infos()

    def lexicon_info(self, lexicon_id: str) -> LexiconInfo:
        """UnknownLexicon when there is none."""
        return self.lexicons.info(lexicon_id)

    async def delete_lexicon(self, lexicon_id: str) -> None:
        """Remove an uploaded lexicon (Conflict for a startup one); streams reading with it keep their copy."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.lexicons.delete, lexicon_id)

    @property
    def max_recording_bytes(self) -> int:
        """The largest prompt recording a request may bring (a transport reads one byte more to refuse it)."""
        return cosyvoice2.MAX_RECORDING_BYTES

    # -- load -------------------------------------------------------------------------------------

    def stream_counts(self) -> StreamCounts:
        """Streams admitted and running, and waiting for room."""
        return StreamCounts(active=len(self.scheduler.active), queued=len(self.scheduler.waiting))

    def room(self) -> float:
        """Share of the admission budget still free, from the costs measured here: 1 idle, 0 once new streams would
        queue (what a balancer in front of several replicas weighs them by)."""
        counts = self.stream_counts()
        if counts.queued or counts.active >= self.settings.max_active_streams:
            return 0.0
        return min(1.0, max(0.0, 1.0 - self.scheduler.load().fraction / self.settings.max_load))

    def busy(self) -> bool:
        """Streams admitted and not finished, or waiting (what a drain waits for)."""
        counts = self.stream_counts()
        return bool(counts.active or counts.queued)

    # -- requests ---------------------------------------------------------------------------------

    def validate(self, request: SynthesisRequest) -> VoiceInfo:
        """Raise what ``open_stream`` would for this request, without opening a stream (a session's settings, or a
        request queued to be opened later, are refused when they arrive); the voice that will speak it."""
        voice = self._check(request)
        if voice is None:
            raise TypeError("a request with a prompt recording is checked by open_prompt_stream")
        return voice.info

    def _check(self, request: SynthesisRequest) -> Voice | None:
        """Check every field of ``request``; its voice (None for a request that brings its own)."""
        names = request.names
        if request.prompt is not None:
            cloning.cloning_service(self.voices)  # first: nothing else matters where recordings cannot be used
        if request.text is not None:
            self._check_text(request.text, names.text, self._rules(request))
        if request.sample_rate is not None and request.sample_rate not in SUPPORTED_SAMPLE_RATES:
            supported = ", ".join(map(str, SUPPORTED_SAMPLE_RATES))
            raise InvalidRequest(
                f"unsupported sample rate {request.sample_rate}; supported: {supported}",
                code="unsupported_sample_rate",
                param=names.sample_rate,
            )
        if request.prompt is not None:
            if request.prompt.mode == "zero_shot":
                self._check_text(request.prompt.text, names.prompt_text)
            if request.prompt.mode == "instruct2":
                self._check_text(request.options.instructions or "", names.instructions)
            self._check_options(cosyvoice2.validate, request.options, names.speed)
            return None
        voice = self._resolve(request.voice, names.voice, request.unknown_voice_is_default)
        self._lexicons(request, voice)
        if request.instructions_required:
            self._check_text(request.options.instructions or "", names.instructions)
            self._check_follows_instructions(voice, names.voice)
        self._check_options(voice.validate, request.options, names.speed)
        return voice

    def _rules(self, request: SynthesisRequest, voice: Voice | None = None) -> MarkupRules:
        """How ``request``'s text is read, by ``voice`` (what any voice may read, without one)."""
        return MarkupRules(
            text_type=request.text_type,
            inline_tags=request.inline_tags,
            reads_phonemes=voice is not None and voice.info.reads_phonemes,
            max_break_s=self.settings.ssml_max_break_s,
            max_silence_s=self.settings.ssml_max_silence_s,
        )

    def _lexicons(self, request: SynthesisRequest, voice: Voice) -> tuple[Lexicon, ...]:
        """The lexicons ``request`` is read with (UnknownLexicon naming its field for an id the server lacks)."""
        try:
            return self.lexicons.for_voice(voice.info.language, request.lexicons)
        except UnknownLexicon as error:
            raise UnknownLexicon(error.lexicon_id, self.lexicons.ids(), param=request.names.lexicons) from None

    def _check_text(self, text: str, param: str, rules: MarkupRules | None = None) -> None:
        """Raise InvalidRequest for text that is empty, unspeakable or too long; with ``rules``, read as the
        request says (SSML that does not read is ``invalid_ssml``; markup alone is nothing to speak)."""
        if not text or not text.strip():
            raise InvalidRequest(f"'{param}' is empty", code="empty_input", param=param)
        if len(text) > self.settings.max_text_chars:
            raise InvalidRequest(
                f"'{param}' has {len(text)} characters; the limit is {self.settings.max_text_chars}",
                code="input_too_long",
                param=param,
            )
        if rules is not None:
            try:
                items, _ = read_plan(text, rules)
            except MarkupError as error:
                raise invalid_ssml(error, param) from error
            speakable = any(
                isinstance(item, Pause) or (isinstance(item, Speech) and is_speakable(item.text.text)) for item in items
            )
        else:
            speakable = is_speakable(text)
        if not speakable:
            raise InvalidRequest(
                f"'{param}' has nothing to speak (no letters or digits)", code="empty_input", param=param
            )

    def _check_follows_instructions(self, voice: Voice, param: str) -> None:
        if voice.info.follows_instructions:
            return
        able = [info.id for info in self.voice_infos() if info.follows_instructions]
        if not able:
            raise ModelNotLoaded(
                "no voice on this server follows instructions: start it with RTVOICE_COSYVOICE_DIR set to a "
                "CosyVoice2 model directory",
                code="model_not_loaded",
            )
        raise InvalidRequest(
            f"voice {voice.info.id!r} cannot follow instructions; use one that can: {', '.join(able)}",
            code="voice_not_instructable",
            param=param,
        )

    @staticmethod
    def _check_options(use: Callable[[SynthesisOptions], T], options: SynthesisOptions, param: str) -> T:
        """``use(options)``, or InvalidRequest naming ``param`` when it raises ValueError for options a voice
        cannot honour (``use``: a voice's ``validate`` or ``open_session``, or its model's rule)."""
        try:
            return use(options)
        except ValueError as error:
            raise InvalidRequest(str(error), code="invalid_value", param=param) from error

    def open_stream(self, request: SynthesisRequest) -> SpeechStream:
        """Check ``request`` and admit its stream; with ``request.text`` its input is complete, without it the
        caller pushes text (``SpeechStream.push_text``, held to the same limits).

        Raises InvalidRequest (or UnknownVoice, ModelNotLoaded) naming the field at fault, and Overloaded past the
        limits. A request with its own voice (``prompt``) opens with ``open_prompt_stream``.
        """
        voice = self._check(request)
        if voice is None:
            raise TypeError("a request with a prompt recording opens with open_prompt_stream")
        return self._open(voice, request)

    async def open_prompt_stream(self, request: SynthesisRequest, recording: Recording) -> SpeechStream:
        """``open_stream`` for a request that brings its own voice: the recording is read once the rest of the
        request has been checked, and its features are extracted off the event loop."""
        prompt = request.prompt
        if prompt is None:
            raise TypeError("open_prompt_stream needs a request with a prompt")
        self._check(request)
        audio = await read_recording(recording)
        instructions = request.options.instructions if prompt.mode == "instruct2" else None
        voice = await cloning.prompt_voice(
            self.voices, audio, prompt.mode, prompt.text, instructions, request.names.prompt_audio
        )
        return self._open(voice, replace(request, options=replace(request.options, instructions=None)))

    def _open(self, voice: Voice, request: SynthesisRequest) -> SpeechStream:
        session = self._check_options(voice.open_session, request.options, request.names.speed)
        segmenter = Segmenter.of(
            self.settings,
            voice.info.language,
            spoken=request.normalize,
            rules=self._rules(request, voice),
            lexicons=self._lexicons(request, voice),
        )
        stream = SpeechStream(
            voice,
            session,
            segmenter,
            request.sample_rate or voice.info.sample_rate,
            self.core.wake,
            max_buffered_s=self.settings.max_buffered_audio_s,
            clock=self.scheduler.clock,
            on_end=self.scheduler.stream_ended,
            trim_leading_silence=request.trim_leading_silence,
            text_limit=TextLimit(self.settings.max_text_chars, request.names.text),
            words=request.words,
        )
        if request.text is not None:  # before admission, which weighs how much audio it asks for
            stream.push_text(request.text)
            stream.close_input()
        self.scheduler.admit(stream)
        self.core.wake()
        return stream
