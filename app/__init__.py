"""rtvoice's transports: each module turns one protocol into engine requests and engine audio back into it."""
