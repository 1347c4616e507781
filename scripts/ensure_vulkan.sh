#!/usr/bin/env bash
# Makes sure a Vulkan driver is present: on a machine with none (no GPU, a
# fresh container), installs Mesa's software driver lavapipe.
set -euo pipefail
for icd in /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json; do
  [ -e "$icd" ] && exit 0
done
echo "no Vulkan driver found: installing lavapipe (software Vulkan)" >&2
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends mesa-vulkan-drivers libvulkan1 >/dev/null
