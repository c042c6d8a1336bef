#!/usr/bin/env python3
"""Far end of tests/veth_frames_test.sh: receives DBLP frames two ways.

1. A plain kernel UDP socket bound to --ip:--port. The kernel only delivers a
   datagram whose IPv4 header, lengths and (non-zero) UDP checksum are right,
   so this proves the frames are real UDP.
2. An AF_PACKET capture on --iface. The kernel accepts UDP checksum 0, so the
   capture is what proves the checksums themselves: every header field, the
   IPv4 and UDP checksums, the DBLP header and every payload float are checked
   here.

Exits 0 when all --count frames arrived both ways and every check passed.
"""

import argparse
import os
import select
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
DBLP_MAGIC = 0xDB1F
DBLP_VERSION = 1
DBLP_PUSH = 1
DBLP_HDR = struct.Struct("!HBBIHHII")  # 20 bytes, see lib/dblp/wire/wire.h
assert DBLP_HDR.size == 20


def csum16(data: bytes) -> int:
    """One's complement sum of 16-bit big-endian words, folded (not inverted)."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def expected_payload(seq: int, nfloats: int) -> bytes:
    return struct.pack("<%df" % nfloats,
                       *[float(seq * 1000 + i) for i in range(nfloats)])


class Checker:
    def __init__(self, a):
        self.a = a
        self.errors = []
        self.captured = {}  # seq -> (ip_id, dblp bytes)
        self.received = {}  # seq -> dblp bytes from the UDP socket
        self.dst_ip = socket.inet_aton(a.ip)
        self.src_ip = socket.inet_aton(a.src_ip)
        with open("/sys/class/net/%s/address" % a.iface) as f:
            self.mac = bytes.fromhex(f.read().strip().replace(":", ""))

    def err(self, msg):
        if len(self.errors) < 20:
            print("veth_check: FAIL: " + msg, flush=True)
        self.errors.append(msg)

    def floats_for(self, seq):
        return (self.a.last_payload_floats if seq == self.a.count - 1
                else self.a.payload_floats)

    def check_dblp(self, what, data):
        """Validates header + payload; returns seq or None."""
        if len(data) < DBLP_HDR.size:
            self.err("%s: %d bytes, shorter than a DBLP header" % (what, len(data)))
            return None
        magic, ver, typ, session, rank, plen, rnd, seq = DBLP_HDR.unpack_from(data)
        if (magic, ver, typ) != (DBLP_MAGIC, DBLP_VERSION, DBLP_PUSH):
            self.err("%s: magic/version/type %#x/%d/%d" % (what, magic, ver, typ))
            return None
        if session != self.a.session or rank != self.a.rank or rnd != self.a.round:
            self.err("%s: session/rank/round %#x/%d/%#x" % (what, session, rank, rnd))
        if seq >= self.a.count:
            self.err("%s: seq %d out of range" % (what, seq))
            return None
        nf = self.floats_for(seq)
        if plen != 4 * nf or len(data) != DBLP_HDR.size + plen:
            self.err("%s seq %d: payload_len %d, datagram %d bytes, want %d floats"
                     % (what, seq, plen, len(data), nf))
            return seq
        if data[DBLP_HDR.size:] != expected_payload(seq, nf):
            self.err("%s seq %d: payload pattern differs" % (what, seq))
        return seq

    def check_frame(self, f):
        """Every L2-L4 field of one captured frame."""
        if len(f) < 42 or f[12:14] != b"\x08\x00":
            return  # not IPv4 (e.g. stray IPv6/ARP): not ours
        ip = f[14:34]
        ver_ihl, tos, tot, ip_id, frag, ttl, proto, _ck, src, dst = \
            struct.unpack("!BBHHHBBH4s4s", ip)
        if proto != 17 or dst != self.dst_ip:
            return
        udp = f[34:42]
        sport, dport, ulen, ucks = struct.unpack("!HHHH", udp)
        if dport != self.a.port:
            return
        what = "frame ip_id %d" % ip_id
        if f[0:6] != self.mac:
            self.err("%s: dst MAC %s, want %s" % (what, f[0:6].hex(), self.mac.hex()))
        if ver_ihl != 0x45 or tos != 0:
            self.err("%s: version/IHL %#x tos %d" % (what, ver_ihl, tos))
        if tot != len(f) - 14 and not (len(f) == 60 and tot < 46):
            self.err("%s: IP total length %d, frame %d bytes" % (what, tot, len(f)))
            return
        if frag != 0x4000:
            self.err("%s: flags/fragment %#06x, want DF only" % (what, frag))
        if ttl != 64:
            self.err("%s: TTL %d" % (what, ttl))
        if src != self.src_ip:
            self.err("%s: src IP %s" % (what, socket.inet_ntoa(src)))
        if csum16(ip) != 0xFFFF:
            self.err("%s: bad IPv4 header checksum" % what)
        if sport != self.a.src_port:
            self.err("%s: src port %d" % (what, sport))
        if ulen != tot - 20:
            self.err("%s: UDP length %d, IP payload %d" % (what, ulen, tot - 20))
            return
        dgram = f[34:34 + ulen]
        pseudo = src + dst + struct.pack("!BBH", 0, 17, ulen)
        ok = csum16(pseudo + dgram) == 0xFFFF
        mode = self.a.udp_cksum
        if mode == "valid" and (ucks == 0 or not ok):
            self.err("%s: UDP checksum %#06x does not verify" % (what, ucks))
        elif mode == "zero" and ucks != 0:
            self.err("%s: UDP checksum %#06x, want 0 (checksum=none)" % (what, ucks))
        elif mode == "corrupt" and (ucks == 0 or ok):
            self.err("%s: UDP checksum %#06x verifies but should be corrupt"
                     % (what, ucks))
        seq = self.check_dblp(what, dgram[8:])
        if seq is None:
            return
        if seq in self.captured:
            self.err("seq %d captured twice" % seq)
        self.captured[seq] = (ip_id, dgram[8:])

    def done(self):
        want_rx = 0 if self.a.udp_cksum == "corrupt" else self.a.count
        return len(self.captured) >= self.a.count and len(self.received) >= want_rx

    def run(self):
        a = self.a
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        cap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        for s in (udp, cap):
            try:  # root may exceed rmem_max
                s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE
            except OSError:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        udp.bind((a.ip, a.port))
        cap.bind((a.iface, 0))
        udp.setblocking(False)
        cap.setblocking(False)
        if a.ready_file:
            with open(a.ready_file, "w") as f:
                f.write("ready\n")
        print("veth_check: listening on %s udp %s:%d, mode %s, want %d frames"
              % (a.iface, a.ip, a.port, a.udp_cksum, a.count), flush=True)

        deadline = time.monotonic() + a.timeout
        settle = None  # after everything arrived, wait a little for extras
        while time.monotonic() < deadline:
            if self.done():
                if settle is None:
                    settle = time.monotonic() + a.settle
                elif time.monotonic() >= settle:
                    break
            r, _, _ = select.select([udp, cap], [], [], 0.1)
            if cap in r:
                while True:
                    try:
                        f, addr = cap.recvfrom(65535)
                    except BlockingIOError:
                        break
                    if addr[2] != PACKET_OUTGOING:
                        self.check_frame(f)
            if udp in r:
                while True:
                    try:
                        d, peer = udp.recvfrom(65535)
                    except BlockingIOError:
                        break
                    seq = self.check_dblp("udp socket datagram", d)
                    if seq is not None:
                        if seq in self.received:
                            self.err("seq %d delivered twice" % seq)
                        self.received[seq] = d
                        if peer != (a.src_ip, a.src_port):
                            self.err("datagram from %s, want %s:%d"
                                     % (peer, a.src_ip, a.src_port))
        return self.report()

    def report(self):
        a = self.a
        if len(self.captured) != a.count:
            missing = sorted(set(range(a.count)) - set(self.captured))[:10]
            self.err("captured %d/%d frames (missing e.g. %s)"
                     % (len(self.captured), a.count, missing))
        # IP ids increment by one per frame (frames are built in seq order).
        ids = [self.captured[s][0] for s in sorted(self.captured)]
        for prev, cur in zip(ids, ids[1:]):
            if cur != (prev + 1) & 0xFFFF:
                self.err("IP id %d follows %d" % (cur, prev))
                break
        if a.udp_cksum == "corrupt":
            if self.received:
                self.err("kernel delivered %d datagrams with a corrupt UDP "
                         "checksum" % len(self.received))
        else:
            if len(self.received) != a.count:
                self.err("UDP socket received %d/%d datagrams"
                         % (len(self.received), a.count))
            for seq, d in self.received.items():
                if seq in self.captured and self.captured[seq][1] != d:
                    self.err("seq %d: socket bytes differ from the capture" % seq)
        print("veth_check: mode %s: captured %d, socket received %d, %d errors"
              % (a.udp_cksum, len(self.captured), len(self.received),
                 len(self.errors)), flush=True)
        return 0 if not self.errors else 1


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iface", required=True)
    p.add_argument("--ip", required=True, help="our IPv4 (UDP bind address)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--src_ip", required=True)
    p.add_argument("--src_port", type=int, default=9200)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--payload_floats", type=int, default=363)
    p.add_argument("--last_payload_floats", type=int, default=None)
    p.add_argument("--session", type=lambda s: int(s, 0), default=0x5EED0001)
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--round", type=lambda s: int(s, 0), default=0xFFFFFFFE)
    p.add_argument("--udp_cksum", choices=["valid", "zero", "corrupt"],
                   default="valid")
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--settle", type=float, default=0.3,
                   help="extra wait after all frames arrived")
    p.add_argument("--ready_file", default="")
    a = p.parse_args()
    if a.last_payload_floats is None:
        a.last_payload_floats = a.payload_floats
    return Checker(a).run()


if __name__ == "__main__":
    sys.exit(main())
