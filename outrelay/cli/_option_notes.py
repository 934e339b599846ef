"""Meanings of config options whose model field has no ``description`` (used by ``config_doc``).

Keyed by model class name, then option. A field's own ``description`` wins; a
test fails when an option has neither (so a new option cannot go undocumented).
"""

from __future__ import annotations

__all__ = ["NOTES"]

_TLS_FILES = {
    "tls_ca_file": "CA bundle (PEM) to verify the server with, instead of the system trust store",
    "tls_cert_file": "client certificate (PEM) for mutual TLS",
    "tls_key_file": "private key (PEM) of `tls_cert_file`",
}
_AWS = {
    "region": "AWS region (default: the SDK's: `AWS_REGION`, profile, instance metadata)",
    "endpoint_url": "a non-AWS endpoint (LocalStack, moto, a VPC endpoint)",
    "profile": "a named profile of `~/.aws/config`",
    "access_key_id": "static credentials (default: the SDK's credential chain)",
    "secret_access_key": "secret of `access_key_id`",
    "session_token": "session token of temporary credentials",
    "connect_timeout": "seconds to connect to the service",
    "read_timeout": "seconds to wait for an answer",
    "sdk_max_attempts": "attempts inside the SDK per call (1: failures go straight back to the relay's backoff)",
    "message_limit": "the service's size limit in bytes for one message and for one batch request",
}

NOTES: dict[str, dict[str, str]] = {
    "OutrelayConfig": {
        "outbox": "the `[outbox]` table",
        "relay": "the `[relay]` table",
        "bus": "the `[bus]` table",
        "event_log": "the `[event_log]` table: one log line per published event on the `outrelay.events` "
        "logger (see docs/observability.md)",
        "audit": "the `[audit]` table: the tamper-evident audit chain (see docs/audit.md)",
        "attempts": "the `[attempts]` table: the delivery-attempt log (see docs/attempts.md)",
        "tracing": "the `[tracing]` table: OpenTelemetry spans and W3C trace context on every event "
        "(off by default; see docs/tracing.md)",
        "crypto": "the `[crypto]` table: AES-256-GCM payload encryption with `keys` (name = `env:VAR` or "
        "`file:/path`), `encrypt_with`, `[[crypto.rules]]` (`types`, `tenants`, `destinations`) and `at_rest`; "
        "absent: off (see docs/encryption.md)",
        "destinations": "one `[destinations.NAME]` table per destination",
        "routes": "`[[routes]]` entries; none: every event goes to every destination",
    },
    "OutboxConfig": {
        "url": "the outbox database: `sqlite:///PATH` (one relay per file) or "
        "`postgresql://USER@HOST:PORT/DB` (several relays; password via `${VAR}` or `PGPASSWORD`)",
    },
    "RelayConfig": {
        "poll_interval": "seconds between checks for new work when nothing woke the relay",
        "route_batch": "events routed to their destinations per routing pass",
        "lease_seconds": "how long claimed work stays reserved for this relay; renewed while it runs, so a "
        "crashed relay's work is taken over after at most this long",
        "shutdown_grace": "seconds SIGTERM/SIGINT waits for batches in flight before giving them back",
    },
    "BusConfig": {
        "destination": "the destination subscribers consume from (overridden by `$OUTRELAY_BUS`); "
        "unset: the in-process bus",
        "dead_letters": "database URL of consumer dead letters (default: the outbox's)",
        "claim_timeout": "seconds after which a dead group member's unacknowledged events move to a live one",
    },
    "DestinationConfig": {
        "transport": "which transport delivers: one of the names under *Transports* below (or a plugin's)",
        "enabled": "false: the destination is not started and its events wait",
        "batch_size": "events per send (capped by the transport's own maximum)",
        "retry": "the `[destinations.NAME.retry]` table",
    },
    "RetryPolicy": {
        "max_attempts": "attempts before the route's `on_exhausted` applies (dead-letter or park)",
        "initial_delay": "seconds before the first retry",
        "max_delay": "longest wait between two attempts, in seconds",
        "multiplier": "each retry waits this many times longer than the previous one",
        "jitter": "fraction of randomness taken off each wait (0: none, 1: full jitter)",
        "max_retry_after": "cap, in seconds, on a broker's Retry-After hint",
    },
    "RouteConfig": {
        "types": "event type globs this route matches (`order.*`)",
        "tenants": "tenant globs (empty: any tenant)",
        "streams": "stream globs (empty: any stream)",
        "labels": "labels an event must carry with these values",
        "tags": "tags an event must carry",
        "destinations": "where matching events go (names of `[destinations.NAME]` tables)",
        "on_exhausted": "after `retry.max_attempts`: `dead-letter` sets the event aside and the stream goes on; "
        "`park` stops the stream until an operator acts (`outrelay dlq replay`)",
    },
    "FileConfig": {
        "path": "file to append JSON lines to; a template (`out/{stream}.jsonl`)",
        "fsync": "fsync after each batch (durable across power loss, slower)",
    },
    "MemoryConfig": {
        "broker": "name of the in-process broker (tests, the in-process bus)",
        "target": "template of the message target",
        "max_message_bytes": "refuse larger event data (unset: no limit)",
        "dedupe": "drop a re-sent event id",
        "reject_types": "event types the broker refuses (tests)",
        "latency": "seconds each send takes (tests)",
        "down": "every send fails as if the broker were unreachable (tests)",
    },
    "KafkaConfig": {
        "bootstrap_servers": "`host:port` list, as a comma-separated string or a list",
        "topic": "topic name; a template (`events.{category}`); the stream is the record key",
        "mode": "CloudEvents Kafka binding: `binary` (ce_* headers, raw data) or `structured` (JSON envelope)",
        "client_id": "client id the broker logs and quotas see",
        "enable_idempotence": "idempotent producer (the broker drops retried duplicates); off only for brokers "
        "without InitProducerId",
        "linger_ms": "milliseconds the producer waits to fill a batch",
        "batch_bytes": "bytes of one record batch per partition; keep under the broker's `message.max.bytes`",
        "max_message_bytes": "largest event data accepted; larger is rejected (dead-lettered)",
        "compression": "record batch compression",
        "security_protocol": "Kafka `security.protocol`",
        "sasl_mechanism": "SASL mechanism (with `SASL_*` protocols)",
        "sasl_username": "SASL user",
        "sasl_password": "SASL password (use `${VAR}`)",
        "ssl_cafile": "CA bundle (PEM) to verify the brokers",
        "ssl_certfile": "client certificate (PEM) for mutual TLS",
        "ssl_keyfile": "private key (PEM) of `ssl_certfile`",
        "ssl_password": "password of `ssl_keyfile`",
        "ssl_check_hostname": "verify the broker's host name against its certificate",
    },
    "NatsConfig": {
        "servers": "`nats://` or `tls://` URLs of the cluster",
        "subject": "subject to publish to; a template (`events.{category}.{stream}`); the stream must capture it",
        "expected_stream": "send `Nats-Expected-Stream`: the publish fails unless this JetStream stream stores it",
        "create_stream": "create this stream at open if missing (development; see the table below)",
        "connect_timeout": "seconds to connect",
        "reconnect_time_wait": "seconds between reconnect attempts",
        "name": "client name the server shows",
        "tls": "use TLS with the system trust store (a `tls://` server implies it)",
        **_TLS_FILES,
        "tls_hostname": "host name to verify the certificate against (default: the server's)",
        "credentials_file": "a `.creds` file (JWT + nkey); at most one kind of credentials",
        "nkey_seed_file": "an nkey seed file",
        "token": "an auth token (use `${VAR}`)",
        "user": "user name (with `password`)",
        "password": "password of `user` (use `${VAR}`)",
    },
    "StreamSpec": {
        "name": "JetStream stream name",
        "subjects": "subjects the stream captures (`events.>`)",
        "storage": "file or memory storage",
        "replicas": "replicas in a cluster",
    },
    "RabbitMQConfig": {
        "url": "`amqp://` or `amqps://` broker URL; put the password in `password`",
        "user": "user name (overrides the URL's)",
        "password": "password (use `${VAR}`); overrides the URL's",
        "vhost": "virtual host (overrides the URL's path)",
        "exchange": 'exchange to publish to; a template; `""` is the default exchange',
        "routing_key": "routing key; a template (`{category}.{type}`)",
        "exchange_type": "type used when `declare_exchange` creates the exchange",
        "mandatory": "ask the broker to return messages no queue is bound for (instead of dropping them)",
        "unroutable": "a returned (unroutable) message is `permanent` (dead-lettered) or `retryable` (a queue "
        "will be bound later)",
        "persistent": "delivery mode 2: messages survive a broker restart in durable queues",
        "connect_timeout": "seconds to connect",
        "max_message_bytes": "largest event data accepted; larger is rejected",
        "tls": "use TLS (`amqps://`) with the system trust store",
        **_TLS_FILES,
    },
    "RedisConfig": {
        "url": "`redis://`, `rediss://` (TLS) or `unix://`; no password here (use `password`)",
        "stream": "Redis stream key to XADD to; a template (`events:{category}`)",
        "mode": "entry layout: `binary` (ce_* fields, raw data) or `structured` (one JSON field)",
        "dedupe": "`auto`: native dedupe with XADD IDMP on Redis ≥ 8.6; `off`: none",
        "batching": "`script`: a batch in one Lua call (needs +eval); `pipeline`: plain XADDs",
        "producer_id": "IDMP producer id: the same for every relay of one outbox",
        "dedupe_window": "seconds the server remembers event ids (its IDMP-DURATION)",
        "username": "ACL user",
        "password": "password (use `${VAR}`)",
        "ssl_ca_certs": "CA bundle (PEM) to verify the server (`rediss://`)",
        "ssl_certfile": "client certificate (PEM)",
        "ssl_keyfile": "private key (PEM) of `ssl_certfile`",
        "ssl_check_hostname": "verify the server's host name against its certificate",
        "max_message_bytes": "largest event data accepted; larger is rejected",
        "connect_timeout": "seconds to connect",
        "socket_timeout": "seconds one command may take",
    },
    "PubSubConfig": {
        "emulator_host": "`host:port` of the Pub/Sub emulator (no credentials then)",
        "credentials_file": "service-account JSON key (default: application default credentials)",
    },
    "PulsarConfig": {
        "service_url": "`pulsar://` or `pulsar+ssl://` URL",
        "topic": "topic; a template (`persistent://tenant/ns/{type}`)",
        "token": "JWT auth token (use `${VAR}`)",
        "tls_trust_certs_file_path": "CA bundle (PEM) to verify the broker",
        "tls_allow_insecure_connection": "accept an unverified certificate (never in production)",
        "tls_validate_hostname": "verify the broker's host name against its certificate",
        "deduplication": "the namespace has deduplication on: send sequence ids so the broker drops re-sends",
        "batching": "let the producer batch messages",
        "batching_max_messages": "messages per producer batch",
        "batching_max_publish_delay_ms": "milliseconds a producer batch may wait to fill",
        "max_pending_messages": "messages the producer queues before sends wait",
        "send_timeout": "seconds one send may take",
        "connect_timeout": "seconds to connect",
        "operation_timeout": "seconds a broker operation (lookup, create producer) may take",
    },
    "ServiceBusConfig": {
        "connection_string": "SAS connection string (use `${VAR}`); or `fully_qualified_namespace`",
        "fully_qualified_namespace": "`NS.servicebus.windows.net`, authenticated with DefaultAzureCredential",
        "queue": "queue name; a template (give `queue` or `topic`)",
        "topic": "topic name; a template",
        "sessions": "the entity requires sessions: the stream becomes the SessionId (FIFO per stream)",
        "duplicate_detection": "the entity has duplicate detection on (a re-sent event id is dropped)",
        "dedupe_window": "the entity's duplicate-detection window, in seconds",
        "partitioned": "the entity is partitioned: one batch holds one partition key",
        "max_message_bytes": "largest event data accepted; larger is rejected",
        "sdk_retry_total": "retries inside the SDK (0: failures go straight back to the relay's backoff)",
        "busy_retry_after": "seconds to wait after `server-busy`",
        "send_timeout": "seconds one send may take",
        "open_timeout": "seconds to connect",
    },
    "SNSConfig": {**_AWS, "topic_arn": "topic ARN; a template"},
    "SQSConfig": {
        **_AWS,
        "queue_url": "queue URL; a template",
        "delay_seconds": "SQS DelaySeconds per message (not on FIFO queues)",
    },
    "WebhookConfig": {},
}
