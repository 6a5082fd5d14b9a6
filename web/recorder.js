// An AudioWorklet processor that hands each 128-sample block of its input to the page while it records: the page
// keeps what a WebRTC track played, for the WAV download. It outputs silence, so it adds nothing to what is heard.

class Recorder extends AudioWorkletProcessor {
  constructor() {
    super();
    this.recording = false;
    this.port.onmessage = (message) => { this.recording = message.data === "start"; };
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (this.recording && channel) this.port.postMessage(channel.slice());
    return true;
  }
}

registerProcessor("rtvoice-recorder", Recorder);
