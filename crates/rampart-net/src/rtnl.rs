//! A small synchronous rtnetlink client: one request, one acknowledgement.
//!
//! Messages are built with `netlink-packet-route` and sent on a blocking `netlink-sys`
//! socket. The socket belongs to the network namespace of the thread that opened it, which
//! is how the sandbox side is configured (see [`crate::wire`]).

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::io;
use std::net::{IpAddr, Ipv4Addr};

/// An rtnetlink socket of the calling thread's network namespace.
pub(crate) struct Rtnl {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Rtnl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rtnl").field("seq", &self.seq).finish()
    }
}

impl Rtnl {
    /// Opens a socket in the calling thread's network namespace.
    pub(crate) fn open() -> io::Result<Rtnl> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        Ok(Rtnl {
            sock,
            seq: 0,
            buf: vec![0; 32 * 1024],
        })
    }

    /// Sends one request and waits for its acknowledgement.
    fn request(&mut self, msg: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = seq;
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        nl.finalize();
        let mut out = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut out);
        self.sock.send(&out, 0)?;
        loop {
            let n = self.sock.recv(&mut &mut self.buf[..], 0)?;
            let mut off = 0;
            while off < n {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.buf[off..n])
                    .map_err(|e| io::Error::other(format!("netlink answer: {e}")))?;
                let len = msg.header.length as usize;
                if len == 0 {
                    break;
                }
                off += (len + 3) & !3;
                if msg.header.sequence_number != seq {
                    continue;
                }
                if let NetlinkPayload::Error(e) = msg.payload {
                    return match e.code {
                        None => Ok(()),
                        Some(_) => Err(e.to_io()),
                    };
                }
            }
        }
    }

    /// Creates a veth pair: `host` here, `peer` (named `peer_name`) straight in the network
    /// namespace of process `peer_pid`.
    pub(crate) fn add_veth(
        &mut self,
        host: &str,
        peer_name: &str,
        peer_pid: u32,
    ) -> io::Result<()> {
        let mut peer = LinkMessage::default();
        peer.attributes
            .push(LinkAttribute::IfName(peer_name.to_owned()));
        peer.attributes.push(LinkAttribute::NetNsPid(peer_pid));
        let mut link = LinkMessage::default();
        link.attributes.push(LinkAttribute::IfName(host.to_owned()));
        link.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
        ]));
        self.request(
            RouteNetlinkMessage::NewLink(link),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// Deletes a link by name; a missing link is not an error.
    pub(crate) fn del_link(&mut self, name: &str) -> io::Result<()> {
        let mut link = LinkMessage::default();
        link.attributes.push(LinkAttribute::IfName(name.to_owned()));
        match self.request(RouteNetlinkMessage::DelLink(link), 0) {
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(()),
            r => r,
        }
    }

    /// Sets a link up.
    pub(crate) fn set_up(&mut self, index: u32) -> io::Result<()> {
        let mut link = LinkMessage::default();
        link.header.index = index;
        link.header.flags = LinkFlags::Up;
        link.header.change_mask = LinkFlags::Up;
        self.request(RouteNetlinkMessage::SetLink(link), 0)
    }

    /// Adds `addr/prefix_len` to a link.
    pub(crate) fn add_addr(
        &mut self,
        index: u32,
        addr: Ipv4Addr,
        prefix_len: u8,
    ) -> io::Result<()> {
        let mut m = AddressMessage::default();
        m.header.family = AddressFamily::Inet;
        m.header.prefix_len = prefix_len;
        m.header.scope = AddressScope::Universe;
        m.header.index = index;
        m.attributes.push(AddressAttribute::Local(IpAddr::V4(addr)));
        m.attributes
            .push(AddressAttribute::Address(IpAddr::V4(addr)));
        self.request(
            RouteNetlinkMessage::NewAddress(m),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// Adds a default route via `gateway` on link `index`.
    pub(crate) fn add_default_route(&mut self, index: u32, gateway: Ipv4Addr) -> io::Result<()> {
        let mut m = RouteMessage::default();
        m.header.address_family = AddressFamily::Inet;
        m.header.destination_prefix_length = 0;
        m.header.table = RouteHeader::RT_TABLE_MAIN;
        m.header.protocol = RouteProtocol::Static;
        m.header.scope = RouteScope::Universe;
        m.header.kind = RouteType::Unicast;
        m.attributes
            .push(RouteAttribute::Gateway(RouteAddress::Inet(gateway)));
        m.attributes.push(RouteAttribute::Oif(index));
        self.request(RouteNetlinkMessage::NewRoute(m), NLM_F_CREATE | NLM_F_EXCL)
    }
}

/// The index of a link of the calling thread's network namespace.
pub(crate) fn if_index(name: &str) -> io::Result<u32> {
    let c =
        std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(i)
    }
}
