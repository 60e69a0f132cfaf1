"""A stand-in desktop notification server: owns org.freedesktop.Notifications, records each Notify.

    python notify_listener.py BUS_ADDRESS OUTFILE
Prints "ready" once it owns the name; appends each notification to OUTFILE as a JSON line.
"""

import json
import sys

from jeepney import HeaderFields, MessageType, new_method_return
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection

conn = open_dbus_connection(bus=sys.argv[1])
conn.send_and_get_reply(message_bus.RequestName("org.freedesktop.Notifications"))
print("ready", flush=True)
n = 0
while True:
    msg = conn.receive()
    h = msg.header
    if h.message_type != MessageType.method_call:
        continue
    if h.fields.get(HeaderFields.member) == "Notify":
        n += 1
        app, _replaces, _icon, summary, body, _actions, hints, _timeout = msg.body
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps({"app": app, "summary": summary, "body": body,
                                "urgency": hints.get("urgency", (None, None))[1]}) + "\n")
        conn.send(new_method_return(msg, "u", (n,)))
