#!/usr/bin/env python3
"""Writes Protobuf events as a Confluent producer does, with Google's protobuf package (the
runtime confluent-kafka's ProtobufSerializer uses): byte 0, the schema id as 4 big-endian bytes,
the message indexes (zigzag varints: their count, then each; the single byte 0 for [0]), the
serialized message. Message classes are built at runtime from the schemas' FileDescriptorProtos
(descriptor_pool, message_factory): no protoc needed.

stdin, first line: {"schemas": {<name>: <hex of a serialized FileDescriptorSet>, ...},
  "descriptor_set_out": {"schema": <name>, "path": <path>} or null (write that set there,
  as Google's protobuf serializes it)}
then one JSON object per line: {"schema": <name>, "id": <schema id, or null: a bare message>,
  "message": <full name>, "indexes": [...], "record": {...} (the proto3 JSON mapping)}
stdout: each payload as a 4-byte big-endian length and the bytes.
"""
import json
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory


def zigzag_varint(n):
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def main():
    lines = iter(sys.stdin)
    head = json.loads(next(lines))
    pools = {}
    for name, hexed in head["schemas"].items():
        files = descriptor_pb2.FileDescriptorSet.FromString(bytes.fromhex(hexed))
        pool = descriptor_pool.DescriptorPool()
        for f in files.file:
            pool.AddSerializedFile(f.SerializeToString())
        pools[name] = (pool, files, {})
    target = head.get("descriptor_set_out")
    if target:
        files = pools[target["schema"]][1]
        with open(target["path"], "wb") as out:
            out.write(descriptor_pb2.FileDescriptorSet(file=list(files.file)).SerializeToString())
    out = sys.stdout.buffer
    for line in lines:
        item = json.loads(line)
        pool, _, classes = pools[item["schema"]]
        name = item["message"]
        if name not in classes:
            classes[name] = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
        body = json_format.ParseDict(item["record"], classes[name]()).SerializeToString()
        if item["id"] is None:
            payload = body
        else:
            indexes = item["indexes"]
            if indexes == [0]:
                prefix = b"\x00"
            else:
                prefix = zigzag_varint(len(indexes)) + b"".join(zigzag_varint(i) for i in indexes)
            payload = b"\x00" + struct.pack(">I", item["id"]) + prefix + body
        out.write(struct.pack(">I", len(payload)) + payload)
    out.flush()


main()
