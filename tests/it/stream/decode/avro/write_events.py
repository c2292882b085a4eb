#!/usr/bin/env python3
"""Writes Avro events as a Confluent producer does (fastavro, the writer confluent-kafka's
AvroSerializer uses): byte 0, the schema id as 4 big-endian bytes, the schemaless datum.

stdin: one JSON object per line, {"id": <schema id>, "schema": <schema JSON>, "record": {...}}
stdout: each payload as a 4-byte big-endian length and the bytes.
"""
import io
import json
import struct
import sys

import fastavro

parsed = {}
out = sys.stdout.buffer
for line in sys.stdin:
    item = json.loads(line)
    key = json.dumps(item["schema"], sort_keys=True)
    if key not in parsed:
        parsed[key] = fastavro.parse_schema(item["schema"])
    buf = io.BytesIO()
    buf.write(b"\x00" + struct.pack(">I", item["id"]))
    fastavro.schemaless_writer(buf, parsed[key], item["record"])
    payload = buf.getvalue()
    out.write(struct.pack(">I", len(payload)) + payload)
out.flush()
