"""Audio plumbing shared by every transport: PCM conversion, cross-fades, resampling, encoding, framing."""
