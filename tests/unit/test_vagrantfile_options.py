"""The Vagrantfile's provider options, evaluated without Vagrant.

Ruby evaluates vagrant/Vagrantfile against a recording stand-in for
``Vagrant.configure`` (every ``x.y = v`` and ``x.y(args)`` is written down
under its path), once per environment: KVM or software emulation (tcg), the
local box or a public one. What is checked is what libvirt would be told:
the domain type and CPU mode for each accelerator (host-passthrough is
refused without KVM), and for the local box qemu's user network with ssh
forwarded to loopback only, and the placeholder NIC whose MAC the box's
network configuration (vagrant/build-box.sh) must match.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VAGRANTFILE = REPO / "vagrant" / "Vagrantfile"

pytestmark = pytest.mark.skipif(shutil.which("ruby") is None, reason="needs ruby (apt install ruby)")

RECORDER = r"""
require "json"
LOG = {}
class Rec
  def initialize(path) = @path = path
  def respond_to_missing?(*) = true
  def method_missing(name, *args, **kw, &blk)
    key = (@path + [name.to_s.chomp("=")]).join(".")
    if name.to_s.end_with?("=")
      LOG[key] = args[0]
    elsif blk && name == :provider
      blk.call(Rec.new(["provider", args[0]]), Rec.new(["override", args[0]]))
    elsif args.empty? && kw.empty?
      Rec.new(@path + [name.to_s])
    else
      (LOG[key] ||= []) << (args + (kw.empty? ? [] : [kw]))
      nil
    end
  end
end
module Vagrant
  def self.configure(_version) = yield(Rec.new(["config"]))
end
load ARGV[0]
puts JSON.generate(LOG)
"""


def evaluate(tmp_path: Path, **env: str) -> dict:
    rec = tmp_path / "recorder.rb"
    rec.write_text(RECORDER)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TESTBED_", "VAGRANT_"))}
    r = subprocess.run(["ruby", str(rec), str(VAGRANTFILE)], env=dict(clean, **env),
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return json.loads(r.stdout)


def test_software_emulation_uses_qemu_domains_and_the_maximum_cpu(tmp_path):
    log = evaluate(tmp_path, TESTBED_VM_ACCEL="tcg")
    assert log["provider.libvirt.driver"] == "qemu"
    assert log["provider.libvirt.cpu_mode"] == "maximum"   # host-passthrough needs KVM
    assert log["override.libvirt.vm.boot_timeout"] >= 900


def test_kvm_passes_the_host_cpu_through(tmp_path):
    log = evaluate(tmp_path, TESTBED_VM_ACCEL="kvm")
    assert log["provider.libvirt.driver"] == "kvm"
    assert log["provider.libvirt.cpu_mode"] == "host-passthrough"
    assert "override.libvirt.vm.boot_timeout" not in log


def test_public_boxes_stay_the_default_for_both_providers(tmp_path):
    log = evaluate(tmp_path, TESTBED_VM_ACCEL="kvm")
    assert log["config.vm.box"] == "bento/ubuntu-24.04"
    assert log["override.libvirt.vm.box"] == "generic/ubuntu2404"
    assert log["provider.virtualbox.cpus"] == 4 and log["provider.virtualbox.memory"] == 8192
    assert "provider.libvirt.qemuargs" not in log and "provider.libvirt.mgmt_attach" not in log


def test_the_local_box_reaches_its_guest_on_loopback_only(tmp_path):
    log = evaluate(tmp_path, TESTBED_VM_ACCEL="tcg", TESTBED_BOX="local",
                   TESTBED_VM_SSH_PORT="3022", TESTBED_VM_CPUS="2", TESTBED_VM_MEMORY_MB="6144")
    assert log["override.libvirt.vm.box"] == "testbed/debian12-netem"
    assert log["provider.libvirt.cpus"] == 2 and log["provider.libvirt.memory"] == 6144
    assert log["provider.libvirt.mgmt_attach"] is False      # no libvirt network, bridge or NAT
    assert log["provider.libvirt.qemu_use_agent"] is True
    args = [call[0]["value"] for call in log["provider.libvirt.qemuargs"]]
    netdev = args[args.index("-netdev") + 1]
    assert netdev.startswith("user,") and "hostfwd=tcp:127.0.0.1:3022-:22" in netdev
    assert log["override.libvirt.ssh.host"] == "127.0.0.1"
    assert log["override.libvirt.ssh.port"] == 3022
    (kind, opts), = log["override.libvirt.vm.network"]
    assert kind == "private_network" and opts["libvirt__tunnel_type"] == "udp"
    assert opts["auto_config"] is False
    # the box gives the placeholder NIC its address by this MAC, and takes
    # DHCP on the user network's NIC: the two files must agree
    box = (REPO / "vagrant" / "build-box.sh").read_text()
    assert f"MACAddress={opts['libvirt__mac']}" in box
    device = args[args.index("-device") + 1]
    user_mac = re.search(r"mac=([0-9a-f:]+)", device).group(1)
    assert user_mac != opts["libvirt__mac"]


def test_a_wrong_accelerator_is_refused_by_name(tmp_path):
    with pytest.raises(AssertionError, match="TESTBED_VM_ACCEL=hvf: give kvm or tcg"):
        evaluate(tmp_path, TESTBED_VM_ACCEL="hvf")
