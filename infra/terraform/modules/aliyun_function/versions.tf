terraform {
  required_version = ">= 1.5"

  required_providers {
    alicloud = {
      source = "aliyun/alicloud"
      # alicloud_ram_role's role_name and assume_role_policy_document, since 1.252.0.
      version = ">= 1.252.0"
    }
  }
}
