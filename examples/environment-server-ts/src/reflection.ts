// Descriptors for server reflection that reflection clients (grpcurl, Postman) can resolve.
//
// proto-loader builds each type's descriptors from protobufjs, one file per package, and two things in
// them differ from what protoc writes (grpc/grpc-node#2958):
//   - a file's `dependency` list is empty, so a client cannot find google.protobuf.Struct from the
//     rljob.v1 file that uses it: each file here lists the files whose packages its fields name;
//   - a map field's entry type is named after the field (`Fields`), where protoc names it
//     `<Field>Entry` (`FieldsEntry`) and clients refuse any other name: each entry is renamed so.
// The service itself does not need this; only reflection reads these descriptors.

import * as protoLoader from "@grpc/proto-loader";
import { FileDescriptorProto } from "protobufjs/ext/descriptor";

interface Field {
  name?: string;
  typeName?: string;
}

interface Message {
  name?: string;
  field?: Field[];
  nestedType?: Message[];
  options?: { mapEntry?: boolean };
}

interface File {
  name?: string;
  package?: string;
  dependency?: string[];
  messageType?: Message[];
}

type Descriptors = { fileDescriptorProtos?: Buffer[] };

/** protoc's name of a map field's entry type: `metrics` -> `MetricsEntry`, `some_map` -> `SomeMapEntry`. */
function entryName(field: string): string {
  return field.replace(/(^|_)([a-z])/g, (_, __, c: string) => c.toUpperCase()) + "Entry";
}

/** Renames the map entries of `message` and those nested in it; returns every type name its fields use. */
function fixMaps(message: Message): string[] {
  const used: string[] = [];
  for (const nested of message.nestedType ?? []) {
    used.push(...fixMaps(nested));
    if (!nested.options?.mapEntry) continue;
    const field = (message.field ?? []).find((f) => f.typeName?.split(".").pop() === nested.name);
    if (!field?.name || !field.typeName) continue;
    const renamed = entryName(field.name);
    field.typeName = [...field.typeName.split(".").slice(0, -1), renamed].join(".");
    nested.name = renamed;
  }
  for (const field of message.field ?? []) if (field.typeName) used.push(field.typeName.replace(/^\./, ""));
  return used;
}

function decode(bin: Buffer): File {
  return FileDescriptorProto.decode(bin) as unknown as File;
}

/** The package definition with its descriptors corrected for reflection (see above). */
export function reflectable(definition: protoLoader.PackageDefinition): protoLoader.PackageDefinition {
  const files = new Map<string, File>();
  for (const type of Object.values(definition) as Descriptors[]) {
    for (const file of (type.fileDescriptorProtos ?? []).map(decode)) {
      if (file.name && !files.has(file.name)) files.set(file.name, file);
    }
  }
  const fileOfPackage = new Map([...files.values()].map((file) => [file.package ?? "", file.name ?? ""]));
  const encoded = new Map<string, Buffer>();
  for (const [name, file] of files) {
    const imports = new Set(file.dependency ?? []);
    for (const typeName of (file.messageType ?? []).flatMap(fixMaps)) {
      const pkg = [...fileOfPackage.keys()].find((p) => p && p !== file.package && typeName.startsWith(`${p}.`));
      if (pkg) imports.add(fileOfPackage.get(pkg)!);
    }
    file.dependency = [...imports];
    encoded.set(name, Buffer.from(FileDescriptorProto.encode(file as never).finish()));
  }
  const patched: protoLoader.PackageDefinition = {};
  for (const [key, type] of Object.entries(definition)) {
    const protos = (type as Descriptors).fileDescriptorProtos;
    const remap = (bin: Buffer) => encoded.get(decode(bin).name ?? "") ?? bin;
    patched[key] = protos ? ({ ...type, fileDescriptorProtos: protos.map(remap) } as typeof type) : type;
  }
  return patched;
}
