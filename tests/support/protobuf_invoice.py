"""`shop.Invoice` importing `shop.Money` from another file, as a generated module would
declare them (a descriptor pool of their own): a Protobuf schema with a reference, for
the tests of readers that have no generated class."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["invoice_class"]


def invoice_class() -> Any:
    """`shop.Invoice` as a generated module would declare it (its own descriptor pool),
    importing `shop.Money` from shop/money.proto: the same messages as the text forms."""
    f = descriptor_pb2.FieldDescriptorProto
    money = descriptor_pb2.FileDescriptorProto(name="shop/money.proto", package="shop")
    money.syntax = "proto3"
    m = money.message_type.add(name="Money")
    m.field.add(name="cents", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    m.field.add(name="currency", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    invoice = descriptor_pb2.FileDescriptorProto(name="shop/invoice.proto", package="shop")
    invoice.syntax = "proto3"
    invoice.dependency.append("shop/money.proto")
    i = invoice.message_type.add(name="Invoice")
    i.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    total = i.field.add(name="total", number=2, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL)
    total.type_name = ".shop.Money"
    lines = i.field.add(name="lines", number=3, type=f.TYPE_MESSAGE, label=f.LABEL_REPEATED)
    lines.type_name = ".shop.Invoice.Line"
    line = i.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    price = line.field.add(name="price", number=2, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL)
    price.type_name = ".shop.Money"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(money)
    pool.Add(invoice)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Invoice"))
