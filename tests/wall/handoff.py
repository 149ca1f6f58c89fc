#!/usr/bin/python3
"""A socket made by root, used by a walled process.

    handoff.py UID HOST PORT

Root creates a TCP socket, then the process drops to UID (as a process that
received the descriptor over SCM_RIGHTS would be) and connects it. Prints
probe.py's JSON. The socket's owner, which `meta skuid` matches, is its
creator: root.
"""
import json
import os
import socket
import sys


def main():
    uid, host, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    s = socket.socket()
    s.settimeout(3)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    try:
        s.connect((host, port))
        reply = s.recv(4096).decode().strip()
        print(json.dumps({"outcome": "ok", "reply": reply, "uid": os.getuid()}))
    except OSError as e:
        print(json.dumps({"outcome": "refused", "errno": str(e), "uid": os.getuid()}))


if __name__ == "__main__":
    main()
