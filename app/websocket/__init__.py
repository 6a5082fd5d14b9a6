"""WebSockets: rtvoice's own streaming protocol, ``/v1/tts/stream`` (``router.py``: the route; ``messages.py``:
client messages and server events; ``connection.py``: the receive loop; ``sender.py``: the sender task;
``utterances.py``: the utterances in order), and ``io.py``, what every WebSocket protocol shares (Cartesia's too).
"""
