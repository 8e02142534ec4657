"""Allows a user an operation on a literal resource of the test broker, as kafka-acls does.

Usage: allow.py BOOTSTRAP USER OPERATION RESOURCE_TYPE NAME, for example
allow.py 127.0.0.1:9092 reader READ TOPIC orders-changelog
"""

import sys

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

bootstrap, user, operation, resource_type, name = sys.argv[1:]
admin = AdminClient({"bootstrap.servers": bootstrap})
binding = AclBinding(
    ResourceType[resource_type],
    name,
    ResourcePatternType.LITERAL,
    f"User:{user}",
    "*",
    AclOperation[operation],
    AclPermissionType.ALLOW,
)
for future in admin.create_acls([binding]).values():
    future.result(timeout=30)
