// Words: the text being spoken with each word highlighted while it is heard, the text heard at Stop, word timings
// lined up with the page's own PCM playback, and the timings as WebVTT captions.

import { audio } from "./audio.js";

// Word events (every transport) carry the word as sent (`text`, `char_start`/`char_end` in the utterance's text)
// and its place in the utterance's audio (`start_s`, `end_s`). Each transport says when that audio plays here;
// the transcript highlights the word then.
export class Transcript {
  constructor(element, heardLine, heardText, stats) {
    Object.assign(this, { element, heardLine, heardText, stats });
    this.text = ""; this.words = []; this.current = null; this.heardEnd = null;
  }

  begin(text) {
    Object.assign(this, { text, words: [], current: null, heardEnd: null });
    this.stats.highlights = [];
    this.stats.heard = null;
    this.heardLine.hidden = true;
    this.render();
  }

  // `word` starts playing at `startsAt()` (performance.now() time, asked again on each tick: a transport may
  // learn its playout delay only once audio plays); it is highlighted from then until the next one.
  at(word, startsAt) { this.words.push({ ...word, startsAt, shown: false }); }

  // Called on every animation frame.
  tick() {
    if (this.heardEnd !== null) return;
    const now = performance.now();
    let changed = false;
    for (const word of this.words) {
      if (word.shown || word.startsAt() > now) continue;
      word.shown = true;
      changed = true;
      this.current = word;
      this.stats.highlights.push({ text: word.text, char_start: word.char_start, char_end: word.char_end,
                                   start_s: word.start_s, at: now });
    }
    if (changed) this.render();
  }

  // The last word whose audio has all played by now, on this page's clock.
  lastPlayed() {
    const now = performance.now();
    let last = null;
    for (const word of this.words) if (word.startsAt() + (word.end_s - word.start_s) * 1000 <= now) last = word;
    return last;
  }

  // Stop: the text up to the end of `lastWord` (null: nothing whole) was heard; nothing more is highlighted.
  showHeard(lastWord) {
    this.heardEnd = lastWord ? lastWord.char_end : 0;
    this.stats.heard = this.text.slice(0, this.heardEnd);
    this.heardText.textContent = this.stats.heard || "(no whole word yet)";
    this.heardLine.hidden = false;
    this.render();
  }

  // Playback ended by itself: every word was heard, none is highlighted any more.
  finish() {
    if (this.heardEnd !== null) return;
    this.words = [];
    this.current = null;
    this.element.replaceChildren(this.span("heard", this.text));
  }

  // No more highlights (the words' audio was dropped).
  clear() { this.words = []; }

  span(className, text) {
    const element = document.createElement(className === "current" ? "mark" : "span");
    if (className !== "current") element.className = className;
    element.textContent = text;
    return element;
  }

  render() {
    const { text, current } = this;
    if (this.heardEnd !== null) {
      this.element.replaceChildren(this.span("heard", text.slice(0, this.heardEnd)), text.slice(this.heardEnd));
    } else if (current) {
      this.element.replaceChildren(this.span("heard", text.slice(0, current.char_start)),
        this.span("current", text.slice(current.char_start, current.char_end)), text.slice(current.char_end));
    } else {
      this.element.replaceChildren(text);
    }
  }
}

/** Lines up a PCM utterance's words with the page's playback: a word arrives before the audio that holds its
 * start and waits here until that audio is scheduled; it is heard at that sample's context time (plus the output's
 * latency), so highlights follow the page's own playback, underruns included. */
export class PcmWordClock {
  constructor(transcript) { this.transcript = transcript; this.begin(24000); }

  begin(rate) { Object.assign(this, { rate, pending: [], samples: 0, active: true }); }

  word(event) { if (this.active) this.pending.push(event); }

  scheduled(played) {  // the utterance's next `played.samples` samples play from context time `played.at`
    if (!this.active || !played) return;
    const end = this.samples + played.samples;
    while (this.pending.length && this.pending[0].start_s * this.rate < end) {
      const word = this.pending.shift();
      const offset = Math.max(0, word.start_s * this.rate - this.samples) / this.rate;
      this.hearAt(word, played.at + offset);
    }
    this.samples = end;
  }

  done(endTime) {  // words that start in no sample the page got (none, normally) are heard as its audio ends
    for (const word of this.pending.splice(0)) this.hearAt(word, endTime);
  }

  stop() { this.active = false; this.pending = []; }

  hearAt(word, contextTime) {
    const ctx = audio();
    const startsAt = performance.now() + (contextTime - ctx.currentTime + (ctx.outputLatency || 0)) * 1000;
    this.transcript.at(word, () => startsAt);
  }
}

function vttTime(seconds) {
  const ms = Math.round(seconds * 1000);
  const pad = (n, width = 2) => String(n).padStart(width, "0");
  return `${pad(Math.floor(ms / 3600000))}:${pad(Math.floor(ms / 60000) % 60)}:${pad(Math.floor(ms / 1000) % 60)}`
    + `.${pad(ms % 1000, 3)}`;
}

/** WebVTT captions, one cue a word, from word events (`text`, `start_s`, `end_s`). */
export function webVtt(words) {
  const cues = words.map((w, i) => `${i + 1}\n${vttTime(w.start_s)} --> ${vttTime(Math.max(w.end_s, w.start_s + 0.001))}`
    + `\n${w.text.replace(/-->/g, "->")}`);
  return ["WEBVTT", ...cues].join("\n\n") + "\n";
}
