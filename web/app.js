// rtvoice's playground: one text box, three transports (WebRTC/WHEP, WebSocket, HTTP with SSE), each word
// highlighted as it is heard, a latency panel (the page's first audio beside the server's), a waveform, downloads,
// the code for the settings on screen, a history, and cloning where a model can. Plain ES modules, no build step,
// nothing from outside this server. `window.rtvoice` is what the browser tests read.

import { analyser, audio, currentLevel, PcmPlayer, TrackRecorder, wavBlob } from "./audio.js";
import { snippets } from "./code.js";
import { PcmWordClock, Transcript, webVtt } from "./words.js";

const $ = (id) => document.getElementById(id);

const PCM_RATE = 24000;  // what the page asks every PCM transport for
const SILENCE = 0.005;  // output RMS below this is silence (Stop-to-silence)
const HISTORY_SIZE = 20;

// What the page measured, for people (the readouts) and for the browser tests.
const stats = (window.rtvoice = {
  transport: null, requestSentAt: null, firstAudioAt: null, ttfaMs: null, serverTtfaMs: null, maxLevel: 0,
  events: [], errors: [], lastError: null, whepConnected: false, state: "idle", info: null,
  highlights: [], heard: null, stoppedAt: null, stopToSilenceMs: null, finishedAt: null, runs: 0,
  samplesPlayed: 0, rate: null, seedUsed: null, words: [], llm: null, history: 0, underruns: 0,
});

const transcript = new Transcript($("transcript"), $("heard"), $("heard-text"), stats);
const player = new PcmPlayer();
const pcmWords = new PcmWordClock(transcript);
let info = { max_text_chars: 4096, speed: { min: 0.25, max: 4 }, formats: [], keys_required: false, cloning: false };
let run = null;  // the utterance on screen: its settings, words and what the server reported

function setState(text) {
  stats.state = text;
  $("state").textContent = text;
}

// ---- errors: the server's body in an alert box, the field it names marked, Retry-After counted down ------------

const FIELDS = { input: "text", text: "text", tts_text: "text", voice: "voice", speaker_id: "voice", spk_id: "voice",
                 speed: "speed", seed: "seed", api_key: "api-key", prompt_text: "clone-text", prompt_wav: "clone-file",
                 voice_id: "clone-id" };
let retryTimer = null;

function clearError() {
  $("error").hidden = true;
  $("error").replaceChildren();
  for (const element of document.querySelectorAll("[aria-invalid]")) element.removeAttribute("aria-invalid");
  clearInterval(retryTimer);
  retryTimer = null;
  updateCounter();
}

/** Show an error: {message, code, param, request_id, retry_after_s} (all but the message optional). */
function showError(error) {
  const { message = "failed", code = null, param = null, request_id: requestId = null } = error;
  stats.errors.push(message);
  stats.lastError = error;
  const box = $("error");
  const line = (text) => { const p = document.createElement("p"); p.textContent = text; return p; };
  const title = document.createElement("p");
  const strong = document.createElement("strong");
  strong.textContent = message;
  title.append(strong);
  const lines = [title];
  if (code) lines.push(line(`Code: ${code}`));
  const field = param && FIELDS[param] ? $(FIELDS[param]) : null;
  if (param) {
    const label = field && document.querySelector(`label[for="${field.id}"]`);
    lines.push(line(`Field: ${param}${label ? ` (${label.firstChild.textContent.trim()})` : ""}`));
  }
  if (field) field.setAttribute("aria-invalid", "true");
  if (requestId) lines.push(line(`Request id: ${requestId}`));
  box.replaceChildren(...lines);
  box.hidden = false;
  if (error.retry_after_s) countDown(Number(error.retry_after_s));
  $("ttfa").textContent = "–";  // no first audio for this request
  $("server-ttfa").textContent = "–";
  $("ttfa-gap").textContent = "–";
  if (run) endRun("error");
  else setState("error");
}

// 503 (busy, draining) and 429 (a key's quota): Speak waits for the server's Retry-After, counted down in the alert.
function countDown(seconds) {
  const line = document.createElement("p");
  $("error").append(line);
  let left = Math.ceil(seconds);
  const show = () => {
    line.textContent = left > 0 ? `Retry in ${left} s.` : "You can retry now.";
    $("speak").disabled = left > 0 || overLimit();
  };
  show();
  clearInterval(retryTimer);
  retryTimer = setInterval(() => {
    left -= 1;
    show();
    if (left <= 0) { clearInterval(retryTimer); retryTimer = null; }
  }, 1000);
}

// An HTTP error answer as an error; a 401 also shows the key field.
async function failure(response) {
  let error = { message: `HTTP ${response.status}` };
  try { error = { ...error, ...(await response.json()).error }; } catch (_) { /* not the error body */ }
  error.request_id = error.request_id || response.headers.get("X-Request-ID");
  const retry = response.headers.get("Retry-After");
  if ((response.status === 503 || response.status === 429) && retry) error.retry_after_s = Number(retry);
  if (response.status === 401) {
    $("key-row").hidden = false;
    $("api-key").focus();
    error.message = `${error.message}: enter the API key`;
    error.param = error.param || "api_key";
  }
  showError(error);
}

// ---- API key: sent on every transport; kept in this tab only -----------------------------------------------------

function apiKey() { return $("api-key").value.trim(); }
function authHeaders() { return apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {}; }
$("api-key").value = sessionStorage.getItem("rtvoice-api-key") || "";
if ($("api-key").value) $("key-row").hidden = false;
$("key-row").addEventListener("submit", (event) => {  // Enter in the key field: no page load, the key is read
  event.preventDefault();
  $("api-key").dispatchEvent(new Event("change"));
});
$("api-key").addEventListener("change", () => {
  sessionStorage.setItem("rtvoice-api-key", apiKey());
  stats.errors = [];
  clearError();
  loadVoices().catch((error) => showError({ message: error.message }));
});

// ---- one utterance: its life from Speak to silence ---------------------------------------------------------------

function settings() {
  const seedText = $("seed").value.trim();
  // Always a seed, so "request again in another format" makes the same audio.
  const seed = seedText === "" ? Math.floor(Math.random() * 2 ** 31) : Number(seedText);
  return { text: $("text").value, voice: $("voice").value, speed: Number($("speed").value), seed,
           format: $("format").value, transport: $("transport").value };
}

function beginRun(transport, values) {
  run = { ...values, transport, words: [], serverDone: false, ended: false, rtf: null, lateChunks: null };
  stats.runs += 1;
  Object.assign(stats, { transport, requestSentAt: performance.now(), firstAudioAt: null, ttfaMs: null,
                         serverTtfaMs: null, stoppedAt: null, stopToSilenceMs: null, finishedAt: null,
                         samplesPlayed: 0, rate: null, seedUsed: values.seed, words: run.words, underruns: 0 });
  player.reset();
  for (const id of ["ttfa", "server-ttfa", "ttfa-gap", "rtf", "late", "stop-silence"]) $(id).textContent = "–";
  $("ttfa").textContent = "…";
  $("seed-used").textContent = `Seed used: ${values.seed}`;
  for (const id of ["download-wav", "download-format", "download-json", "download-vtt"]) $(id).disabled = true;
  $("stop").disabled = false;
  waveform.dirty = true;
  setState("waiting for audio");
}

function markFirstAudio() {
  if (!run || stats.firstAudioAt !== null) return;
  stats.firstAudioAt = performance.now();
  stats.ttfaMs = Math.round(stats.firstAudioAt - stats.requestSentAt);
  $("ttfa").textContent = `${stats.ttfaMs} ms`;
  showLatency();
}

function serverTtfa(ms) {
  if (ms === null || ms === undefined) return;
  stats.serverTtfaMs = ms;
  $("server-ttfa").textContent = `${Math.round(ms)} ms`;
  showLatency();
}

function showLatency() {
  if (stats.ttfaMs !== null && stats.serverTtfaMs !== null) {
    $("ttfa-gap").textContent = `${Math.round(stats.ttfaMs - stats.serverTtfaMs)} ms`;
  }
  if (run && run.rtf !== null) $("rtf").textContent = run.rtf.toFixed(3);
  if (run && (run.lateChunks !== null || player.underruns)) {
    const server = run.lateChunks === null ? "–" : String(run.lateChunks);
    $("late").textContent = `${server} (gaps here: ${player.underruns})`;
  }
}

function addWord(event) {
  if (!run) return;
  run.words.push({ text: event.text, char_start: event.char_start, char_end: event.char_end,
                   start_s: event.start_s, end_s: event.end_s });
  waveform.dirty = true;
}

// The server has sent everything; the utterance ends when its audio has played out here.
function serverDone() {
  if (!run) return;
  run.serverDone = true;
  if (run.transport === "webrtc") {
    const delay = (whep && whep.playoutDelayMs) || 100;
    setTimeout(() => { if (run && run.serverDone) endRun("done"); }, delay + 60);
  } else if (!player.playing) endRun("done");
}

player.onIdle = () => { if (run && run.serverDone) endRun("done"); };

// `how`: done (played to its end), stopped, error.
function endRun(how) {
  if (!run || run.ended) { setState(how); return; }
  run.ended = true;
  stats.finishedAt = performance.now();
  if (how === "done") transcript.finish();
  else if (how === "error") transcript.clear();
  $("stop").disabled = true;
  setState(how);
  const webrtc = run.transport === "webrtc" && !run.replay;
  const heard = webrtc ? (whep ? whep.recorder.stop() : new Int16Array(0)) : player.heard();
  const rate = webrtc ? whep && whep.recorder.rate : player.rate;
  stats.samplesPlayed = heard.length;
  stats.rate = rate;
  run.samples = heard;
  run.rate = rate;
  const pcm = heard.length > 0;
  $("download-wav").disabled = !pcm;
  $("download-format").disabled = !run.text;
  $("download-json").disabled = $("download-vtt").disabled = run.words.length === 0;
  if (pcm && !run.replay) addHistory(run);
  updateCounter();
  if (document.activeElement === $("stop")) $("speak").focus({ preventScroll: true });  // Stop is off: keep focus
}

// ---- HTTP: OpenAI's speech API as server-sent events (PCM at 24 kHz, word timings, the server's TTFA) ----------

let httpAbort = null;

async function speakHttp(values, voice = values.voice, text = values.text) {
  httpAbort = new AbortController();
  beginRun("http", { ...values, voice, text });
  const response = await fetch("/v1/audio/speech", {
    method: "POST", signal: httpAbort.signal, headers: { "Content-Type": "application/json", ...authHeaders() },
    body: JSON.stringify({ model: "tts-1", input: text, voice, response_format: "pcm", stream_format: "sse",
                           speed: values.speed, seed: values.seed }),
  });
  if (!response.ok) { await failure(response); return; }
  setState("speaking (HTTP)");
  pcmWords.begin(PCM_RATE);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("");
      if (data) sseEvent(JSON.parse(data));
    }
  }
}

function sseEvent(event) {
  if (event.type === "speech.audio.delta") {
    const binary = atob(event.audio);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    markFirstAudio();
    pcmWords.scheduled(player.push(bytes, PCM_RATE));
    stats.underruns = player.underruns;
    waveform.dirty = true;
    return;
  }
  stats.events.push(event);
  if (event.type === "speech.word") { pcmWords.word(event); addWord(event); }
  else if (event.type === "speech.audio.done") {
    serverTtfa(event.ttfa_ms);
    pcmWords.done(player.nextTime);
    serverDone();
  } else if (event.type === "error") showError(event.error || event);
}

// ---- WebSocket: text in (whole, or in fragments like an LLM), PCM out ------------------------------------------

let socket = null;

function openSocket() {
  return new Promise((resolve, reject) => {
    // Browsers cannot set headers on a WebSocket: the key goes in the query.
    const key = apiKey() ? `?api_key=${encodeURIComponent(apiKey())}` : "";
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/tts/stream${key}`);
    ws.binaryType = "arraybuffer";
    ws.accepting = false;  // audio of a cancelled utterance may still arrive: dropped until the next audio_start
    ws.onopen = () => resolve(ws);
    ws.onerror = () => reject(new Error("WebSocket failed"));
    ws.onclose = () => { if (socket === ws) socket = null; };
    ws.onmessage = (message) => {
      if (typeof message.data !== "string") {
        if (!ws.accepting || !run) return;
        markFirstAudio();
        pcmWords.scheduled(player.push(message.data, PCM_RATE));
        stats.underruns = player.underruns;
        waveform.dirty = true;
        return;
      }
      const event = JSON.parse(message.data);
      stats.events.push(event);
      if (event.type === "error") showError(event);
      else if (event.type === "audio_start") {
        ws.accepting = true;
        ws.utterance = event.utterance;
        pcmWords.begin(PCM_RATE);
        serverTtfa(event.ttfa_ms);
        setState("speaking (WebSocket)");
      } else if (event.type === "word" && event.utterance === ws.utterance) { pcmWords.word(event); addWord(event); }
      else if (event.type === "done" && event.utterance === ws.utterance && run && run.transport === "websocket") {
        if (event.audio_s) run.rtf = event.compute_s / event.audio_s;
        run.lateChunks = event.late_chunks;
        showLatency();
        pcmWords.done(player.nextTime);
        serverDone();
      }
    };
  });
}

// Split text the way an LLM streams it: words, and long words in pieces of at most four characters.
export function fragments(text) {
  const out = [];
  for (const piece of text.match(/\s*\S+\s*/g) || []) {
    for (let i = 0; i < piece.length; i += 4) out.push(piece.slice(i, i + 4));
  }
  return out;
}

let llmTimer = null;

async function speakWebSocket(values) {
  if (!socket || socket.readyState !== WebSocket.OPEN) socket = await openSocket();
  socket.accepting = false;
  // A new start applies from the next utterance: this one's voice, speed and seed.
  socket.send(JSON.stringify({ type: "start", voice: values.voice, sample_rate: PCM_RATE, encoding: "pcm_s16le",
                               speed: values.speed, seed: values.seed }));
  beginRun("websocket", values);
  setState("sent (WebSocket)");
  if (!$("llm").checked) {
    socket.send(JSON.stringify({ type: "text", text: values.text }));
    socket.send(JSON.stringify({ type: "flush" }));
    return;
  }
  const pieces = fragments(values.text);
  const interval = 1000 / Number($("llm-rate").value);
  const ws = socket;
  stats.llm = { fragments: pieces.length, sent: 0, firstSentAt: performance.now(), lastSentAt: null };
  setState("typing (WebSocket)");
  let index = 0;
  const next = () => {
    if (ws.readyState !== WebSocket.OPEN || !run || run.ended) return;
    ws.send(JSON.stringify({ type: "text", text: pieces[index] }));
    index += 1;
    stats.llm.sent = index;
    if (index < pieces.length) { llmTimer = setTimeout(next, interval); return; }
    stats.llm.lastSentAt = performance.now();
    ws.send(JSON.stringify({ type: "flush" }));
  };
  next();
}

// ---- WebRTC: WHEP playback, text over a DataChannel ------------------------------------------------------------

let whep = null;
let whepRequests = 0;

class WhepSession {
  async connect(voice) {
    this.pc = new RTCPeerConnection();
    this.pc.addTransceiver("audio", { direction: "recvonly" });
    this.channel = this.pc.createDataChannel("tts");
    this.playoutDelayMs = null;  // until the player has played out audio
    this.recorder = new TrackRecorder();  // what the track plays, for the WAV download and the history
    this.channel.onmessage = (message) => {
      const event = JSON.parse(message.data);
      stats.events.push(event);
      if (typeof event.request_id === "string" && event.request_id !== this.requestId) return;  // an earlier one's
      if (event.type === "error") { this.speaking = false; showError(event); }
      else if (event.type === "audio_start") serverTtfa(event.ttfa_ms);
      else if (event.type === "word") {
        const arrived = performance.now();
        addWord(event);
        transcript.at(event, () => (this.playoutDelayMs === null ? Infinity : arrived + this.playoutDelayMs));
      } else if (event.type === "done") { this.speaking = false; serverDone(); }
      else if (event.type === "cancelled") {
        this.speaking = false;
        if (this.stopPressed) transcript.showHeard(event.last_word);  // played out, as the server counts it
      }
    };
    this.pc.ontrack = (event) => {
      const stream = event.streams[0] || new MediaStream([event.track]);
      $("player").srcObject = stream;  // Chrome only feeds remote audio to WebAudio while an element plays it
      audio().createMediaStreamSource(stream).connect(analyser());
      this.recording = this.recorder.attach(stream)
        .catch((error) => console.warn("no recording of the WebRTC track:", error));
    };
    await this.pc.setLocalDescription(await this.pc.createOffer());
    await new Promise((resolve) => {
      if (this.pc.iceGatheringState === "complete") return resolve();
      this.pc.addEventListener("icegatheringstatechange", () => {
        if (this.pc.iceGatheringState === "complete") resolve();
      });
    });
    const response = await fetch(`/whep?voice=${encodeURIComponent(voice)}`, {
      method: "POST", headers: { "Content-Type": "application/sdp", ...authHeaders() },
      body: this.pc.localDescription.sdp,
    });
    if (response.status !== 201) {
      await failure(response);
      throw new Error("handled");
    }
    this.location = new URL(response.headers.get("Location"), location.href).toString();
    await this.pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    await new Promise((resolve, reject) => {
      if (this.channel.readyState === "open") return resolve();
      this.channel.onopen = resolve;
      setTimeout(() => reject(new Error("DataChannel did not open")), 10000);
    });
    stats.whepConnected = true;
    this.watchPlayoutDelay();
  }

  // A word event leaves the server with the frame that holds the word's start; the browser plays that frame after
  // its jitter buffer's delay (the mean of the frames it played out), so the word is highlighted that much later.
  watchPlayoutDelay() {
    this.playout = setInterval(async () => {
      (await this.pc.getStats()).forEach((s) => {
        if (s.type === "inbound-rtp" && s.kind === "audio") this.playoutDelay(s);
      });
    }, 100);
  }

  playoutDelay(inbound) {
    if (inbound.jitterBufferEmittedCount > 0) {
      this.playoutDelayMs = (inbound.jitterBufferDelay / inbound.jitterBufferEmittedCount) * 1000;
      stats.playoutDelayMs = this.playoutDelayMs;
    }
  }

  // First audio: the receiver's audio level rises above silence (the server sends silence between utterances).
  watchFirstAudio() {
    clearInterval(this.watch);
    this.watch = setInterval(async () => {
      const report = await this.pc.getStats();
      report.forEach((s) => {
        if (s.type === "inbound-rtp" && s.kind === "audio") {
          stats.packetsReceived = s.packetsReceived;
          this.playoutDelay(s);
          if ((s.audioLevel || 0) > 0.01 || currentLevel() > 0.01) markFirstAudio();
        }
      });
      if (stats.firstAudioAt !== null) clearInterval(this.watch);
    }, 10);
  }

  speak(values) {
    beginRun("webrtc", values);
    this.requestId = `page-${++whepRequests}`;
    this.speaking = true;
    this.stopPressed = false;
    this.recorder.start();
    this.channel.send(JSON.stringify({ type: "tts_request", text: values.text, speaker_id: values.voice,
                                       request_id: this.requestId, speed: values.speed, seed: values.seed }));
    this.watchFirstAudio();
    setState("speaking (WebRTC)");
  }

  // Stop: the server's `cancelled` says what was played out; an utterance already done was heard to its end.
  cancel(pressed) {
    this.stopPressed = pressed;
    if (pressed && !this.speaking) transcript.showHeard(transcript.lastPlayed());
    if (this.channel && this.channel.readyState === "open") this.channel.send('{"type":"cancel"}');
  }

  async close() {
    clearInterval(this.watch);
    clearInterval(this.playout);
    if (this.location) await fetch(this.location, { method: "DELETE", headers: authHeaders() }).catch(() => {});
    this.pc.close();
    stats.whepConnected = false;
  }
}

async function speakWebRtc(values) {
  if (!whep) {
    setState("connecting (WHEP)…");
    const session = new WhepSession();
    await session.connect(values.voice);  // each request names its voice: one session serves them all
    await session.recording;  // the recorder is running before the first text goes out
    whep = session;
  }
  whep.speak(values);
}

// ---- Speak and Stop --------------------------------------------------------------------------------------------

function overLimit() {
  const length = $("text").value.length;
  return length === 0 || length > info.max_text_chars;
}

function updateCounter() {
  const length = $("text").value.length;
  $("counter").textContent = `${length} / ${info.max_text_chars}`;
  $("counter").classList.toggle("over", length > info.max_text_chars);
  $("speak").disabled = overLimit() || retryTimer !== null;
}

async function speak() {
  if ($("speak").disabled) return;
  const values = settings();
  audio();
  stop(false);
  clearError();
  const transport = $("llm").checked ? "websocket" : values.transport;
  transcript.begin(values.text);
  try {
    if (transport === "http") await speakHttp(values);
    else if (transport === "websocket") await speakWebSocket(values);
    else await speakWebRtc(values);
  } catch (error) {
    if (error.name !== "AbortError" && error.message !== "handled") showError({ message: error.message });
  }
}

// `pressed`: by the user, who then sees what was heard (the page's playback for HTTP and the WebSocket, whose audio
// arrives ahead of it; the server's count of what left for the player for WebRTC).
function stop(pressed) {
  clearTimeout(llmTimer);
  const active = run && !run.ended;
  if (pressed && active) stats.stoppedAt = performance.now();
  if (httpAbort) { httpAbort.abort(); httpAbort = null; }
  if (pressed && active && run.transport !== "webrtc") transcript.showHeard(transcript.lastPlayed());
  if (socket && socket.readyState === WebSocket.OPEN) {
    socket.accepting = false;
    if (active) socket.send(JSON.stringify({ type: "cancel" }));
  }
  pcmWords.stop();
  if (whep) whep.cancel(pressed && active && run.transport === "webrtc");
  if (!pressed) transcript.clear();
  player.stop();
  if (active) endRun(pressed ? "stopped" : "idle");
  $("stop").disabled = true;
}

// ---- voices, server info -----------------------------------------------------------------------------------------

let voices = [];

async function loadInfo() {
  const response = await fetch("/v1/info");
  if (!response.ok) return;
  info = await response.json();
  stats.info = info;
  $("version").textContent = `Server ${info.version}.`;
  $("speed").min = info.speed.min;
  $("speed").max = info.speed.max;
  if (info.keys_required) $("key-row").hidden = false;
  $("clone").hidden = !info.cloning;
  $("clone-record").hidden = !(window.isSecureContext && navigator.mediaDevices && window.MediaRecorder);
  const formats = new Set(info.formats);
  for (const option of $("format").options) option.hidden = formats.size > 0 && !formats.has(option.value);
  updateCounter();
}

async function loadVoices() {
  const response = await fetch("/voices", { headers: authHeaders() });
  if (!response.ok) { await failure(response); return; }
  setState("idle");
  voices = await response.json();
  const selected = $("voice").value;
  const byLanguage = new Map();
  for (const v of voices) {
    if (!byLanguage.has(v.language)) byLanguage.set(v.language, []);
    byLanguage.get(v.language).push(v);
  }
  $("voice").replaceChildren(...[...byLanguage.keys()].sort().map((language) => {
    const group = document.createElement("optgroup");
    group.label = language;
    group.append(...byLanguage.get(language).map((v) => {
      const option = document.createElement("option");
      option.value = v.id;
      option.textContent = `${v.name || v.id} (${v.model})`;
      return option;
    }));
    return group;
  }));
  if (voices.some((v) => v.id === selected)) $("voice").value = selected;
  describeVoice();
  updateCode();
}

function describeVoice() {
  const voice = voices.find((v) => v.id === $("voice").value);
  $("voice-description").textContent = voice
    ? `${voice.id}, ${voice.language}, ${voice.sample_rate} Hz${voice.description ? `: ${voice.description}` : ""}` : "";
}

// ---- code, downloads, history ------------------------------------------------------------------------------------

function updateCode() {
  const values = settings();
  const seedText = $("seed").value.trim();
  const shown = { ...values, seed: seedText === "" ? (run ? run.seed : null) : values.seed };
  const code = snippets(location.origin, shown);
  $("code-curl").textContent = code.curl;
  $("code-python").textContent = code.python;
  $("code-openai").textContent = code.openai;
  $("code-js").textContent = code.js;
}

function download(blob, name) {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

$("download-wav").addEventListener("click", () => {
  if (run && run.samples) download(wavBlob(run.samples, run.rate), "rtvoice.wav");
});
$("download-json").addEventListener("click", () => {
  if (run) download(new Blob([JSON.stringify({ text: run.text, words: run.words }, null, 2)],
    { type: "application/json" }), "rtvoice-words.json");
});
$("download-vtt").addEventListener("click", () => {
  if (run) download(new Blob([webVtt(run.words)], { type: "text/vtt" }), "rtvoice.vtt");
});
$("download-format").addEventListener("click", async () => {
  if (!run) return;
  const format = $("format").value;
  const response = await fetch("/v1/audio/speech", {
    method: "POST", headers: { "Content-Type": "application/json", ...authHeaders() },
    body: JSON.stringify({ model: "tts-1", input: run.text, voice: run.voice, response_format: format,
                           speed: run.speed, seed: run.seed }),
  });
  if (!response.ok) { await failure(response); return; }
  download(await response.blob(), `rtvoice.${format}`);
});

const history = [];

function addHistory(entry) {
  history.unshift(entry);
  history.length = Math.min(history.length, HISTORY_SIZE);
  stats.history = history.length;
  $("history").replaceChildren(...history.map((item, index) => {
    const li = document.createElement("li");
    const label = document.createElement("span");
    label.textContent = `${item.text} (${item.voice}, ${item.transport}, ${(item.samples.length / item.rate).toFixed(1)} s)`;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "quiet small";
    button.textContent = "Replay";
    button.setAttribute("aria-label", `Replay: ${item.text.slice(0, 60)}`);
    button.addEventListener("click", () => replay(index));
    li.append(label, button);
    return li;
  }));
}

// Plays a history entry from memory: no request.
function replay(index) {
  const item = history[index];
  stop(false);
  clearError();
  run = { ...item, replay: true, ended: false, serverDone: true };
  stats.replays = (stats.replays || 0) + 1;
  player.reset();
  transcript.begin(item.text);
  pcmWords.begin(item.rate);
  for (const word of item.words) pcmWords.word(word);
  pcmWords.scheduled(player.schedule(item.samples, item.rate));
  $("stop").disabled = false;
  waveform.dirty = true;
  setState("replaying");
}

// ---- waveform: the audio heard, drawn as it arrives, a tick at each word -----------------------------------------

const waveform = {
  dirty: true,
  draw() {
    this.dirty = false;
    const canvas = $("waveform");
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(1, Math.round(canvas.clientWidth * ratio));
    const height = Math.max(1, Math.round(canvas.clientHeight * ratio));
    if (canvas.width !== width || canvas.height !== height) Object.assign(canvas, { width, height });
    const g = canvas.getContext("2d");
    g.clearRect(0, 0, width, height);
    const style = getComputedStyle(document.documentElement);
    const rate = player.rate || PCM_RATE;
    const total = player.chunks.reduce((n, c) => n + c.samples.length, 0);
    const seconds = Math.max(3, total / rate);
    const perColumn = (seconds * rate) / width;
    g.fillStyle = style.getPropertyValue("--accent").trim() || "#1f5fd6";
    let column = 0; let peak = 0; let count = 0;
    for (const { samples } of player.chunks) {
      for (let i = 0; i < samples.length; i++) {
        const v = Math.abs(samples[i]);
        if (v > peak) peak = v;
        if (++count >= perColumn) {
          const h = Math.max(1, (peak / 32768) * height);
          g.fillRect(column, (height - h) / 2, 1, h);
          column += 1; peak = 0; count = 0;
        }
      }
    }
    if (run) {
      g.fillStyle = style.getPropertyValue("--text").trim() || "#000";
      for (const word of run.words) g.fillRect(Math.round((word.start_s / seconds) * width), 0, Math.max(1, ratio), 6 * ratio);
    }
  },
};

// ---- every frame: level meter, highlights, waveform, Stop-to-silence ---------------------------------------------

function frame() {
  const level = currentLevel();
  stats.maxLevel = Math.max(stats.maxLevel, level);
  const percent = Math.min(100, Math.round(level * 400));
  $("level").style.width = `${percent}%`;
  $("level").parentElement.setAttribute("aria-valuenow", String(percent));
  transcript.tick();
  if (stats.stoppedAt !== null && stats.stopToSilenceMs === null && level < SILENCE) {
    stats.stopToSilenceMs = Math.round(performance.now() - stats.stoppedAt);
    $("stop-silence").textContent = `${stats.stopToSilenceMs} ms`;
  }
  if (waveform.dirty) waveform.draw();
  requestAnimationFrame(frame);
}

// ---- cloning (a model that clones is loaded): try once, save as a voice, delete --------------------------------

let recorded = null;

function promptForm() {
  const file = recorded || $("clone-file").files[0];
  if (!file) { showError({ message: "Choose or record a recording first.", param: "prompt_wav" }); return null; }
  const form = new FormData();
  form.append("prompt_text", $("clone-text").value);
  form.append("prompt_wav", file, file.name || "prompt.webm");
  return form;
}

$("clone-try").addEventListener("click", async () => {
  const form = promptForm();
  if (!form) return;
  const values = settings();
  form.append("tts_text", values.text);
  form.append("format", "pcm");
  form.append("sample_rate", String(PCM_RATE));
  form.append("seed", String(values.seed));
  stop(false);
  clearError();
  audio();
  transcript.begin(values.text);
  beginRun("http", { ...values, voice: "(recording)" });
  httpAbort = new AbortController();
  try {
    const response = await fetch("/inference_zero_shot", { method: "POST", body: form, headers: authHeaders(),
                                                            signal: httpAbort.signal });
    if (!response.ok) { await failure(response); return; }
    setState("speaking (cloned)");
    const reader = response.body.getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      markFirstAudio();
      player.push(value, PCM_RATE);
      waveform.dirty = true;
    }
    serverDone();
  } catch (error) {
    if (error.name !== "AbortError") showError({ message: error.message });
  }
});

$("clone-save").addEventListener("click", async () => {
  const form = promptForm();
  if (!form) return;
  form.append("voice_id", $("clone-id").value.trim());
  clearError();
  const response = await fetch("/v1/voices", { method: "POST", body: form, headers: authHeaders() });
  if (!response.ok) { await failure(response); return; }
  const voice = await response.json();
  await loadVoices();
  $("voice").value = voice.id;
  describeVoice();
  setState(`saved voice ${voice.id}`);
});

$("clone-delete").addEventListener("click", async () => {
  clearError();
  const id = $("clone-id").value.trim();
  const response = await fetch(`/v1/voices/${encodeURIComponent(id)}`, { method: "DELETE", headers: authHeaders() });
  if (!response.ok) { await failure(response); return; }
  await loadVoices();
  setState(`deleted voice ${id}`);
});

$("clone-file").addEventListener("change", () => { recorded = null; $("clone-recorded").textContent = ""; });

// Recording needs a secure context (https, or this machine's loopback); the button is hidden elsewhere.
$("clone-record").addEventListener("click", async () => {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  const recorder = new MediaRecorder(stream);
  const parts = [];
  recorder.ondataavailable = (event) => parts.push(event.data);
  recorder.onstop = () => {
    stream.getTracks().forEach((track) => track.stop());
    recorded = new File(parts, "recording.webm", { type: recorder.mimeType || "audio/webm" });
    stats.recordedBytes = recorded.size;
    $("clone-recorded").textContent = `Recorded ${(recorded.size / 1024).toFixed(0)} kB.`;
    $("clone-record").disabled = false;
  };
  $("clone-record").disabled = true;
  $("clone-recorded").textContent = "Recording…";
  recorder.start();
  setTimeout(() => recorder.stop(), 5000);
});

// ---- SSML snippets -----------------------------------------------------------------------------------------------

for (const button of $("ssml").querySelectorAll("button")) {
  button.addEventListener("click", () => {
    const area = $("text");
    const { selectionStart: start, selectionEnd: end, value } = area;
    let insert;
    if (button.dataset.snippet) insert = button.dataset.snippet;
    else {
      const [open, close] = button.dataset.wrap.split("|");
      insert = `${open}${value.slice(start, end) || "text"}${close}`;
    }
    area.setRangeText(insert, start, end, "end");
    area.focus();
    area.dispatchEvent(new Event("input"));
  });
}

// ---- theme -------------------------------------------------------------------------------------------------------

function applyTheme(theme) {
  const dark = theme === "dark" || (theme === null && matchMedia("(prefers-color-scheme: dark)").matches);
  if (theme) document.documentElement.dataset.theme = theme;
  else delete document.documentElement.dataset.theme;
  $("theme").setAttribute("aria-pressed", String(dark));
  waveform.dirty = true;
}

$("theme").addEventListener("click", () => {
  const dark = $("theme").getAttribute("aria-pressed") === "true";
  const theme = dark ? "light" : "dark";
  localStorage.setItem("rtvoice-theme", theme);
  applyTheme(theme);
});
applyTheme(localStorage.getItem("rtvoice-theme"));

// ---- wiring ------------------------------------------------------------------------------------------------------

$("speak").addEventListener("click", speak);
$("stop").addEventListener("click", () => stop(true));
$("preview").addEventListener("click", () => {
  const voice = voices.find((v) => v.id === $("voice").value);
  if (!voice) return;
  stop(false);
  clearError();
  audio();
  const text = `Hello, this is ${voice.name || voice.id}.`;
  transcript.begin(text);
  speakHttp(settings(), voice.id, text).catch((error) => {
    if (error.name !== "AbortError") showError({ message: error.message });
  });
});
$("voice").addEventListener("change", () => { describeVoice(); updateCode(); });
$("transport").addEventListener("change", () => {
  if (whep && $("transport").value !== "webrtc") { whep.close(); whep = null; }
});
$("text").addEventListener("input", () => { updateCounter(); updateCode(); checkMarkup(); });

// SSML is read by the server, which repairs what LLMs get wrong (a bare &, HTML entities); the page only warns when a
// document will not parse as XML, and sends it anyway so the server's own error, with its position, is shown.
function checkMarkup() {
  const text = $("text").value;
  let warning = "";
  if (/^\s*<speak[\s>]/.test(text)) {
    const parsed = new DOMParser().parseFromString(text, "application/xml");
    const error = parsed.querySelector("parsererror");
    if (error) warning = `This SSML may not parse: ${error.textContent.split("\n").find((l) => l.trim()) || "invalid XML"}`;
  }
  stats.markupWarning = warning || null;
  $("ssml-check").textContent = warning;
  $("ssml-check").hidden = !warning;
}
$("speed").addEventListener("input", () => {
  $("speed-value").textContent = `${Number($("speed").value).toFixed(2)}×`;
  updateCode();
});
$("llm-rate").addEventListener("input", () => { $("llm-rate-value").textContent = $("llm-rate").value; });
for (const id of ["seed", "format"]) $(id).addEventListener("input", updateCode);
document.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); speak(); }
  else if (event.key === "Escape" && !$("stop").disabled) { event.preventDefault(); stop(true); }
});
window.addEventListener("beforeunload", () => { if (whep) whep.close(); });
window.addEventListener("resize", () => { waveform.dirty = true; });

requestAnimationFrame(frame);
updateCounter();
updateCode();
loadInfo().catch(() => { /* an older server: the defaults stand */ })
  .then(() => loadVoices())
  .catch((error) => showError({ message: error.message }));
