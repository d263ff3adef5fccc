"""Who may do what: client API keys and their limits (`auth`), the admin key (`admin_auth`), and the
start-time check that refuses an open `/admin` beyond loopback (`exposure`). Kept apart from the
serving layer so a reviewer of the security model reads one room."""
